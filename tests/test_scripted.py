"""Scripted warm-start trajectories: the rollout's token layout, retrieval by the agent's own tool, a second
hop to a missing supporting paragraph, the gold answer."""
import pytest

from searchr1.agent import INFO_HEAD, build_prompt, parse_turn
from searchr1.config import AgentConfig, ModelConfig
from searchr1.data import Question
from searchr1.models import load_tokenizer
from searchr1.retrieval import Passage
from searchr1.reward import make_score
from searchr1.scripted import scripted_episodes


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(ModelConfig(name="tiny", source="tiny"))


def q(qid, question, answer, facts):
    return Question(qid=qid, question=question, answers=(answer,), type="bridge", level="hard",
                    supporting_facts=tuple((t, 0) for t in facts), context=())


def search(queries):
    pages = {"Who directed Alien?": [Passage(0, "Alien (film)", "Alien is directed by Ridley Scott.", 3.0)],
             "Ridley Scott": [Passage(1, "Ridley Scott", "Ridley Scott was born in South Shields.", 2.0)],
             "Capital of France?": [Passage(2, "Paris", "Paris is the capital of France.", 1.0)]}
    return [pages.get(x, []) for x in queries]


def render(hits):
    return "\n".join(f"Doc {i}(Title: {p.title}) {p.text}" for i, p in enumerate(hits, 1)) or "none"


def test_layout_second_hop_and_masks(tok):
    questions = [q("a", "Who directed Alien?", "South Shields", ["Alien (film)", "Ridley Scott"]),
                 q("b", "Capital of France?", "Paris", ["Paris"])]
    agent = AgentConfig(max_searches=2, max_context_tokens=2048)
    trajs, m = scripted_episodes(questions, tok, search, render, agent, make_score("em", 0.0), group_offset=3)
    a, b = trajs
    assert a.prompt_ids == build_prompt(tok, "Who directed Alien?", True, "search_r1")
    assert (a.searches, b.searches, a.group, b.group) == (2, 1, 3, 4)
    assert a.prediction == "South Shields" and a.reward == 1.0 and a.em == 1.0 and a.turn_versions == []
    assert len(a.response_ids) == len(a.loss_mask) == len(a.logprobs)
    # the information blocks are exactly the masked tokens, and they hold what the search returned
    info = tok.decode([t for t, k in zip(a.response_ids, a.loss_mask) if k == 0])
    assert info.count(INFO_HEAD.strip()) == 2 and "born in South Shields" in info
    model_text = tok.decode([t for t, k in zip(a.response_ids, a.loss_mask) if k == 1])
    assert "<search> Ridley Scott </search>" in model_text and model_text.endswith("<answer> South Shields </answer>")
    # each model turn parses as the rollout would parse it
    turns = a.response_text.split(INFO_HEAD)
    assert parse_turn(turns[0]).kind == "search" and parse_turn(turns[-1].split("</information>")[-1]).kind == "answer"
    assert m["rollout/searches"] == 1.5 and m["rollout/answer_rate"] == 1.0


def test_one_search_when_the_agent_allows_one_and_budgets_hold(tok):
    questions = [q("a", "Who directed Alien?", "South Shields", ["Alien (film)", "Ridley Scott"])]
    trajs, _ = scripted_episodes(questions, tok, search, render, AgentConfig(max_searches=1, max_info_tokens=12),
                                 make_score("em", 0.0))
    assert trajs[0].searches == 1 and trajs[0].info_tokens <= 12
    with pytest.raises(ValueError, match="agent.max_context_tokens=40"):
        scripted_episodes(questions, tok, search, render, AgentConfig(max_context_tokens=40), make_score("em", 0.0))
