"""The agent loop against a scripted engine (exact ids, masks, limits, parsing) and the real HF engine."""
import re
from dataclasses import dataclass

import pytest

from searchr1.agent import (ANSWER_CUE, DIRECT_INSTRUCTION, EMPTY_QUERY_INFO, INFO_HEAD, INFO_TAIL, MALFORMED_RULES,
                            SEARCH_INSTRUCTION, STOP_REASONS, build_prompt, parse_turn, run_episodes, sampling_for)
from searchr1.config import AgentConfig, EngineConfig, ModelConfig, SamplingConfig
from searchr1.engines.base import Generation, Sampling
from searchr1.reward import make_score
from searchr1.models import load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(ModelConfig(name="tiny", source="tiny"))


@dataclass
class Q:
    qid: str
    question: str
    answers: tuple


class ScriptedEngine:
    """Plays a list of turn texts per question, token by token, stopping like a real engine would."""

    def __init__(self, tokenizer, scripts: dict[str, list[str]], eos_after: bool = False):
        self.tokenizer, self.scripts, self.eos_after = tokenizer, scripts, eos_after
        self.calls: list[list[list[int]]] = []  # generated ids per call, per row
        self.batch_sizes: list[int] = []

    def generate(self, prompts, sampling):
        self.batch_sizes.append(len(prompts))
        gens = []
        for p in prompts:
            text = self.tokenizer.decode(p)
            question = re.search(r"Question: (.*)\n", text).group(1)
            turn = text.count(INFO_TAIL)  # the instruction names the tag too, never with "\n\n"
            script = self.scripts[question]
            ids = self.tokenizer(script[min(turn, len(script) - 1)], add_special_tokens=False).input_ids
            if self.eos_after:
                ids = ids + [self.tokenizer.eos_token_id]
            out, reason = [], "length"
            for t in ids:
                out.append(t)
                if t == self.tokenizer.eos_token_id:
                    reason = "eos"
                    break
                if any(s in self.tokenizer.decode(out) for s in sampling.stop):
                    reason = "stop"
                    break
                if len(out) == sampling.max_new_tokens:
                    break
            gens.append(Generation(out, [-0.5 - 0.01 * k for k in range(len(out))], reason))
        self.calls.append([g.token_ids for g in gens])
        return gens


class Retriever:
    def __init__(self, text="Paris is the capital of France."):
        self.text, self.calls = text, []

    def __call__(self, queries):
        self.calls.append(list(queries))
        return [f"{self.text} ({q})" for q in queries]


def _cfg(**kw):
    base = dict(max_searches=2, max_new_tokens=64, max_info_tokens=128, max_context_tokens=2048)
    base.update(kw)
    return AgentConfig(**base)


def _score(format_score=0.0):
    return make_score("em", format_score)


def _run(tok, scripts, questions, cfg=None, group_size=1, retriever=None, eos_after=False, max_new=None, score=None):
    cfg = cfg or _cfg()
    engine = ScriptedEngine(tok, scripts, eos_after)
    retriever = retriever or Retriever()
    sampling = sampling_for(cfg, SamplingConfig())
    if max_new:
        sampling = Sampling(temperature=1.0, top_p=1.0, max_new_tokens=max_new)
    trajs, metrics = run_episodes(engine, questions, group_size, retriever, cfg, sampling, score or _score(),
                                  version=lambda: 7)
    return trajs, metrics, engine, retriever


@pytest.mark.parametrize("text, kind, content, malformed", [
    ("<think>x</think><search> who is X </search>", "search", "who is X", ()),
    ("<think>x</think> <answer> Paris </answer>", "answer", "Paris", ()),
    ("<answer>a</answer><answer>b</answer>", "answer", "a", ("text_after_answer",)),
    ("<answer> Paris </answer>.", "answer", "Paris", ("text_after_answer",)),
    ("<answer>   </answer>", "answer", None, ("empty_answer",)),
    ("<search>a <search> b </search>", "search", "b", ("multiple_search",)),
    ("<search>  </search>", "search", "", ("empty_query",)),
    ("<think>x</think> Paris </answer>", "none", None, ("unopened_tag",)),
    ("query</search>", "none", None, ("unopened_tag",)),
    ("<think>x</think><search> who", "none", None, ("unclosed_tag",)),
    ("<answer> Par", "none", None, ("unclosed_tag",)),
    ("The answer is Paris.", "none", None, ("no_tags",)),
    ("<think>I know it</think> Paris", "none", None, ("no_action",)),
    ("<information>made up</information><answer>x</answer>", "answer", "x", ("model_information",)),
    ("<search>q</search> then <answer>x</answer>", "search", "q", ()),  # the first close decides
])
def test_parse_turn_rules(text, kind, content, malformed):
    action = parse_turn(text)
    assert (action.kind, action.content, action.malformed) == (kind, content, malformed)
    assert set(action.malformed) <= set(MALFORMED_RULES)


def test_prompt_uses_chat_template_and_instruction(tok):
    ids = build_prompt(tok, "Who wrote Hamlet?")
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>") and text.endswith("<|im_start|>assistant\n")
    assert "<search> query </search>" in text and "Question: Who wrote Hamlet?\n" in text
    direct = tok.decode(build_prompt(tok, "Who wrote Hamlet?", search=False))
    assert DIRECT_INSTRUCTION.split(".")[0] in direct and "<search>" not in direct


def test_example_prompt_style_opens_the_think_block(tok):
    text = tok.decode(build_prompt(tok, "Who wrote Hamlet?", style="search_r1_example"))
    assert text.endswith("<|im_start|>assistant\n<think>")
    assert text.index("Example:") < text.index("Question: Who wrote Hamlet?")
    assert "<answer> Cupertino </answer>" in text
    with pytest.raises(ValueError, match="agent.prompt"):
        build_prompt(tok, "Q?", style="chatty")


def test_a_base_model_without_a_chat_template_gets_the_plain_instruction_after_bos(tok):
    """Gemma-3-270M (base) ships no chat template: the instruction is the prompt, as Search-R1 prompts base models."""
    import copy

    base = copy.deepcopy(tok)
    base.chat_template = None
    text = base.decode(build_prompt(base, "Who wrote Hamlet?"))
    assert text == (base.bos_token or "") + SEARCH_INSTRUCTION.format(question="Who wrote Hamlet?")
    assert base.decode(build_prompt(base, "Q?", style="search_r1_example")).endswith("Question: Q?\n<think>")


def test_multi_turn_ids_mask_logprobs_are_exact(tok):
    scripts = {"Q1?": ["<think>need facts</think><search> capital of France </search>",
                       "<think>more</think><search> Paris population </search>",
                       "<think>done</think><answer> Paris </answer>"]}
    trajs, metrics, engine, retriever = _run(tok, scripts, [Q("q1", "Q1?", ("paris",))])
    (t,) = trajs
    gens = [call[0] for call in engine.calls]
    assert len(gens) == 3
    head = tok(INFO_HEAD, add_special_tokens=False).input_ids
    tail = tok(INFO_TAIL, add_special_tokens=False).input_ids
    infos = [head + tok(body, add_special_tokens=False).input_ids + tail
             for body in Retriever()(["capital of France", "Paris population"])]
    assert t.prompt_ids == build_prompt(tok, "Q1?")
    assert t.response_ids == gens[0] + infos[0] + gens[1] + infos[1] + gens[2]
    assert t.loss_mask == [1] * len(gens[0]) + [0] * len(infos[0]) + [1] * len(gens[1]) + [0] * len(infos[1]) \
        + [1] * len(gens[2])
    expected_lp = []
    for g, info in zip(gens, infos + [[]]):
        expected_lp += [-0.5 - 0.01 * k for k in range(len(g))] + [0.0] * len(info)
    assert t.logprobs == expected_lp
    assert retriever.calls == [["capital of France"], ["Paris population"]]
    assert (t.prediction, t.reward, t.em, t.f1) == ("Paris", 1.0, 1.0, 1.0)
    assert (t.searches, t.turns, t.stop_reason, t.malformed) == (2, 3, "answer", [])
    assert t.info_tokens == len(infos[0]) + len(infos[1]) and t.turn_versions == [7, 7, 7]
    assert metrics["rollout/reward"] == 1.0 and metrics["rollout/searches"] == 2.0


def test_one_engine_call_and_one_retrieval_per_turn(tok):
    scripts = {"A?": ["<search> a </search>", "<answer> x </answer>"],
               "B?": ["<answer> y </answer>"],
               "C?": ["<search> c </search>", "<search> c2 </search>", "<answer> z </answer>"]}
    qs = [Q("a", "A?", ("x",)), Q("b", "B?", ("n",)), Q("c", "C?", ("z",))]
    trajs, metrics, engine, retriever = _run(tok, scripts, qs, group_size=2)
    assert engine.batch_sizes == [6, 4, 2]
    assert retriever.calls == [["a", "a", "c", "c"], ["c2", "c2"]]
    assert [t.group for t in trajs] == [0, 0, 1, 1, 2, 2]
    assert [t.reward for t in trajs] == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert metrics["rollout/em"] == pytest.approx(4 / 6)
    assert metrics["rollout/answer_rate"] == 1.0
    assert metrics["rollout/turns"] == pytest.approx((2 + 2 + 1 + 1 + 3 + 3) / 6)


def test_search_limit_ends_cleanly(tok):
    scripts = {"L?": ["<search> again </search>"]}
    trajs, metrics, engine, _ = _run(tok, scripts, [Q("l", "L?", ("x",))], cfg=_cfg(max_searches=2))
    (t,) = trajs
    assert (t.searches, t.turns, t.stop_reason) == (2, 3, "max_searches")
    assert t.malformed == ["search_over_limit"] and t.reward == 0.0 and t.prediction is None
    assert metrics["rollout/malformed_total/search_over_limit"] == 1.0
    assert metrics["rollout/stop/max_searches"] == 1.0


def test_force_answer_opens_the_final_turn_and_masks_the_cue(tok):
    scripts = {"F?": ["<search> a </search>", "<search> b </search>", " Paris </answer>"],
               "G?": ["<search> a </search>", "<answer> early </answer>"],
               "H?": ["<search> a </search>", "<search> b </search>", "<search> c </search>"]}
    qs = [Q("f", "F?", ("paris",)), Q("g", "G?", ("early",)), Q("h", "H?", ("x",))]
    trajs, _, engine, retriever = _run(tok, scripts, qs, cfg=_cfg(max_searches=2, force_answer=True))
    f, g, h = trajs
    cue = tok(ANSWER_CUE, add_special_tokens=False).input_ids
    assert (f.prediction, f.reward, f.stop_reason, f.malformed) == ("Paris", 1.0, "answer", [])
    # the cue follows the second information block, untrained; the model's answer tokens are trained
    gen = engine.calls[2][0]
    assert f.response_ids[-len(gen) - len(cue):-len(gen)] == cue
    assert f.loss_mask[-len(gen) - len(cue):] == [0] * len(cue) + [1] * len(gen)
    assert f.logprobs[-len(gen) - len(cue):-len(gen)] == [0.0] * len(cue)
    assert (g.prediction, g.searches, g.stop_reason) == ("early", 1, "answer")  # answering early is untouched
    assert g.loss_mask.count(0) == g.info_tokens  # nothing inserted but its one information block
    # a search written inside the forced answer is still over the limit: no third search, no answer
    assert (h.searches, h.prediction, h.stop_reason, h.malformed) == (2, None, "max_searches", ["search_over_limit"])
    assert retriever.calls == [["a", "a", "a"], ["b", "b"]]
    plain, _, _, _ = _run(tok, scripts, qs[:1], cfg=_cfg(max_searches=2))
    assert (plain[0].prediction, plain[0].stop_reason) == (None, "malformed")  # without the cue: unopened </answer>


def test_search_disabled_is_a_direct_answer(tok):
    scripts = {"D?": ["<think>hm</think><search> q </search>"], "E?": ["<answer> e </answer>"]}
    cfg = _cfg(search=False)
    trajs, _, engine, retriever = _run(tok, scripts, [Q("d", "D?", ("x",)), Q("e", "E?", ("e",))], cfg=cfg)
    assert retriever.calls == [] and len(engine.calls) == 1
    assert trajs[0].stop_reason == "max_searches" and trajs[0].malformed == ["search_over_limit"]
    assert trajs[1].reward == 1.0
    assert "<search>" not in tok.decode(trajs[1].prompt_ids)


def test_turn_token_limit(tok):
    scripts = {"T?": ["<think> " + "very " * 40 + "long"]}
    trajs, metrics, _, _ = _run(tok, scripts, [Q("t", "T?", ("x",))], max_new=5)
    (t,) = trajs
    assert len(t.response_ids) == 5 and t.loss_mask == [1] * 5
    assert t.stop_reason == "max_new_tokens" and t.malformed == ["no_action"]
    assert metrics["rollout/truncated"] == 1.0


def test_context_limit_cuts_turn_and_information(tok):
    prompt_len = len(build_prompt(tok, "C?"))
    scripts = {"C?": ["<search> q </search>", "<answer> x </answer>"]}
    gen_len = len(tok("<search> q </search>", add_special_tokens=False).input_ids)
    retriever = Retriever("word " * 200)
    # Room for the first turn and part of the information block only.
    cfg = _cfg(max_context_tokens=prompt_len + gen_len + 20)
    trajs, _, engine, _ = _run(tok, scripts, [Q("c", "C?", ("x",))], cfg=cfg, retriever=retriever)
    (t,) = trajs
    assert len(t.prompt_ids) + len(t.response_ids) == cfg.max_context_tokens
    assert t.stop_reason == "max_context" and len(engine.calls) == 1
    tail = tok(INFO_TAIL, add_special_tokens=False).input_ids
    assert t.response_ids[-len(tail):] == tail  # the block is shortened, never left open
    # A turn that would pass the limit is cut at it.
    cfg = _cfg(max_context_tokens=prompt_len + 3)
    trajs, _, _, _ = _run(tok, scripts, [Q("c", "C?", ("x",))], cfg=cfg)
    assert len(trajs[0].response_ids) == 3 and trajs[0].stop_reason == "max_context"
    assert trajs[0].loss_mask == [1, 1, 1]


def test_information_block_is_truncated_to_max_info_tokens(tok):
    scripts = {"I?": ["<search> q </search>", "<answer> x </answer>"]}
    cfg = _cfg(max_info_tokens=40)
    trajs, _, engine, _ = _run(tok, scripts, [Q("i", "I?", ("x",))], cfg=cfg, retriever=Retriever("word " * 300))
    (t,) = trajs
    gen0 = engine.calls[0][0]
    info = t.response_ids[len(gen0):len(gen0) + t.info_tokens]
    head = tok(INFO_HEAD, add_special_tokens=False).input_ids
    tail = tok(INFO_TAIL, add_special_tokens=False).input_ids
    assert t.info_tokens == 40 and info[:len(head)] == head and info[-len(tail):] == tail
    assert t.reward == 1.0


def test_empty_query_uses_a_search_without_retrieval(tok):
    scripts = {"E?": ["<search>   </search>", "<answer> x </answer>"]}
    trajs, metrics, _, retriever = _run(tok, scripts, [Q("e", "E?", ("x",))])
    (t,) = trajs
    assert retriever.calls == [] and t.searches == 1 and t.malformed == ["empty_query"]
    assert EMPTY_QUERY_INFO in tok.decode(t.response_ids)
    assert t.reward == 1.0 and metrics["rollout/malformed_total/empty_query"] == 1.0


def test_stop_inside_a_token_keeps_the_token(tok):
    scripts = {"S?": ["<answer> Paris</answer>. More text"]}
    trajs, _, engine, _ = _run(tok, scripts, [Q("s", "S?", ("Paris",))])
    (t,) = trajs
    assert tok.decode(t.response_ids).endswith("</answer>.")  # the token ">." is kept whole
    assert t.response_ids == engine.calls[0][0]
    assert t.prediction == "Paris" and t.malformed == ["text_after_answer"] and t.em == 1.0


def test_eos_without_action_and_prompt_answer_never_counts(tok):
    scripts = {"N?": ["I think it is Beijing."]}
    trajs, metrics, _, _ = _run(tok, scripts, [Q("n", "N?", ("Beijing",))], eos_after=True)
    (t,) = trajs
    assert t.prediction is None and t.reward == 0.0  # the prompt's "<answer> Beijing </answer>" is not read
    assert t.stop_reason == "eos" and t.response_ids[-1] == tok.eos_token_id and t.loss_mask[-1] == 1
    assert metrics["rollout/malformed_total/no_tags"] == 1.0


def test_format_reward_only_for_well_formed_wrong_answers(tok):
    scripts = {"F?": ["<answer> Lyon </answer>"], "G?": ["<answer> Lyon </answer>."]}
    trajs, _, _, _ = _run(tok, scripts, [Q("f", "F?", ("Paris",)), Q("g", "G?", ("Paris",))], score=_score(0.1))
    assert [t.reward for t in trajs] == [0.1, 0.0]


def test_metric_keys_are_stable(tok):
    _, metrics, _, _ = _run(tok, {"K?": ["<answer> k </answer>"]}, [Q("k", "K?", ("k",))])
    for rule in MALFORMED_RULES:
        assert metrics[f"rollout/malformed_total/{rule}"] == 0.0
    assert sum(metrics[f"rollout/stop/{r}"] for r in STOP_REASONS) == 1.0
    for key in ("rollout/generation_s", "rollout/retrieval_s", "rollout/generated_tokens", "rollout/info_tokens"):
        assert key in metrics


def test_loop_on_the_hf_engine_concatenates_engine_output():
    import torch

    from searchr1.engines import make_engine

    cfg = _cfg(max_new_tokens=8, max_searches=1)
    engine = make_engine(ModelConfig(name="tiny", source="tiny"), EngineConfig(name="hf"), cfg.max_context_tokens)
    calls = []
    generate = engine.generate

    def recording(prompts, sampling):
        gens = generate(prompts, sampling)
        calls.append((prompts, gens))
        return gens

    engine.generate = recording
    torch.manual_seed(0)
    qs = [Q("a", "Who?", ("x",)), Q("b", "Where?", ("y",))]
    trajs, metrics = run_episodes(engine, qs, 2, Retriever(), cfg, sampling_for(cfg, SamplingConfig(), seed=1),
                                  _score())
    assert len(trajs) == 4 and calls[0][0] == [t.prompt_ids for t in trajs]
    for i, t in enumerate(trajs):
        assert t.response_ids[:len(calls[0][1][i].token_ids)] == calls[0][1][i].token_ids
        assert t.logprobs[:len(calls[0][1][i].token_ids)] == calls[0][1][i].logprobs
        assert t.stop_reason in STOP_REASONS and sum(t.loss_mask) == t.generated_tokens
    assert metrics["rollout/trajectories_total"] == 4.0


# Partial rollouts: "Quick?" answers in its first turn, "Slow?" searches twice and answers in its third.
PARTIAL_SCRIPTS = {"Quick?": ["<think>k</think><answer> Paris </answer>"],
                   "Slow?": ["<search> one </search>", "<search> two </search>", "<answer> Rome </answer>"],
                   "Next?": ["<answer> Oslo </answer>"]}


def _partial_run(tok, questions, partial, version, group_offset=0):
    from searchr1.agent import Partial  # noqa: F401  (the type the caller owns)

    cfg = _cfg()
    return run_episodes(ScriptedEngine(tok, PARTIAL_SCRIPTS), questions, 2, Retriever(), cfg,
                        sampling_for(cfg, SamplingConfig()), _score(), version=version, group_offset=group_offset,
                        partial=partial)


def test_partial_rollouts_carry_an_unfinished_group_whole_and_lose_no_token(tok):
    from searchr1.agent import Partial

    quick, slow, nxt = Q("q", "Quick?", ("Paris",)), Q("s", "Slow?", ("Rome",)), Q("n", "Next?", ("Oslo",))
    plain, _ = _partial_run(tok, [slow], None, lambda: 3)  # the slow question alone, never cut
    seen = []
    partial = Partial(tokens=1, group_stride=2, may_carry=lambda v: (seen.append(v), True)[1])
    # call 1 (version 3): after the first turn Quick's group is complete and the budget spent: Slow's waits
    first, m1 = _partial_run(tok, [quick, slow], partial, lambda: 3)
    assert [t.qid for t in first] == ["q", "q"] and all(t.em for t in first) and seen == [3]
    assert (partial.carried_in, partial.carried_out) == (0, 1)
    assert [ep.group for ep in partial.carried] == [3, 3] and all(ep.turns == 1 for ep in partial.carried)
    assert m1["rollout/trajectories_total"] == 2.0
    # call 2 (version 4): the carried group goes first; here the bound lets it wait no longer, so it finishes
    partial.may_carry = lambda v: False
    second, _ = _partial_run(tok, [nxt], partial, lambda: 4)
    assert [t.qid for t in second] == ["s", "s", "n", "n"] and [t.group for t in second] == [3, 3, 0, 0]
    assert (partial.carried_in, partial.carried_out) == (1, 0) and partial.carried == []
    for cut, whole in zip(second[:2], plain):
        # the same tokens, masks and log-probs as the uncut episode; only the versions of its turns differ
        assert (cut.response_ids, cut.loss_mask, cut.logprobs) == (whole.response_ids, whole.loss_mask, whole.logprobs)
        assert cut.turn_versions == [3, 4, 4] and cut.policy_version == 3 and cut.em and cut.searches == 2


def test_partial_rollouts_never_return_nothing_and_respect_a_large_budget(tok):
    from searchr1.agent import Partial

    slow, slow2 = Q("s", "Slow?", ("Rome",)), Q("t", "Slow?", ("Rome",))
    # the budget is spent after one turn but no group is complete until the third: nothing is set aside
    partial = Partial(tokens=1, group_stride=2, may_carry=lambda v: True)
    trajs, _ = _partial_run(tok, [slow, slow2], partial, lambda: 0)
    assert len(trajs) == 4 and partial.carried == [] and partial.carried_out == 0
    # a budget never reached cuts nothing
    quick = Q("q", "Quick?", ("Paris",))
    partial = Partial(tokens=10_000, group_stride=2, may_carry=lambda v: True)
    trajs, _ = _partial_run(tok, [quick, slow], partial, lambda: 0)
    assert sorted(t.qid for t in trajs) == ["q", "q", "s", "s"] and partial.carried == []


def test_partial_rollouts_refuse_a_stride_that_would_merge_groups(tok):
    from searchr1.agent import Partial

    quick, slow = Q("q", "Quick?", ("Paris",)), Q("s", "Slow?", ("Rome",))
    partial = Partial(tokens=1, group_stride=1, may_carry=lambda v: True)  # Slow's group 1 becomes 2
    _partial_run(tok, [quick, slow], partial, lambda: 0)
    with pytest.raises(ValueError, match="group_stride"):
        _partial_run(tok, [quick, slow, quick], partial, lambda: 1)
