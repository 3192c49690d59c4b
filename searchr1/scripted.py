"""Scripted trajectories for the supervised warm start, built from training questions only.

A 135M model does not follow the Search-R1 instruction: it neither searches nor answers inside tags, so every
sample of a GRPO group scores the same and there is nothing to learn from. The warm start shows it the
protocol on training questions, in the exact token layout of a rollout:

    <think> I need to search for the facts of this question. </think>
    <search> {the question} </search>                      one search with the question itself
    <information> top-k passages from this project's BM25 </information>          (inserted: no loss)
    <think> I still need information about {title}. </think>
    <search> {title} </search>                              a second hop, when a supporting paragraph's
    <information> ... </information>                        title was not among the first hits
    <think> The information above gives the answer. </think>
    <answer> {gold answer} </answer>

The passages are what the agent's own search tool returns (the same index, tokenizer and passage budget), the
second query is the title of a gold supporting paragraph (training data only), and only the model's turns carry
loss, as in RL. The held-out questions are never seen: the 10-point goal of the learning experiment is measured
from the warm start's checkpoint, so what RL adds is RL's.
"""
from __future__ import annotations

import time
from typing import Callable

from searchr1.agent import INFO_HEAD, INFO_TAIL, build_prompt, rollout_metrics
from searchr1.config import AgentConfig
from searchr1.reward import Score, exact_match, f1
from searchr1.trajectory import Trajectory

FIRST = "<think> I need to search for the facts of this question. </think>\n<search> {query} </search>"
HOP = "<think> I still need information about {query}. </think>\n<search> {query} </search>"
ANSWER = "<think> The information above gives the answer. </think>\n<answer> {answer} </answer>"


def second_query(question, titles: list[str]) -> str | None:
    """The title of the first supporting paragraph the first search did not return, if any."""
    for title, _ in question.supporting_facts:
        if title not in titles:
            return title
    return None


def scripted_episodes(questions: list, tokenizer, search: Callable[[list[str]], list[list]],
                      render: Callable[[list], str], agent: AgentConfig, score: Score, group_offset: int = 0
                      ) -> tuple[list[Trajectory], dict[str, float]]:
    """One scripted trajectory per question (group group_offset + i). `search(queries)` returns hit lists (with
    titles), `render(hits)` the information text the agent would see."""
    started = time.perf_counter()
    head = tokenizer(INFO_HEAD, add_special_tokens=False).input_ids
    tail = tokenizer(INFO_TAIL, add_special_tokens=False).input_ids
    t0 = time.perf_counter()
    first = search([q.question for q in questions])
    hops = [second_query(q, [p.title for p in hits]) if agent.max_searches >= 2 else None
            for q, hits in zip(questions, first)]
    hop_hits = iter(search([h for h in hops if h]))
    retrieval_s = time.perf_counter() - t0
    trajs = []
    for i, (q, hits, hop) in enumerate(zip(questions, first, hops)):
        prompt = build_prompt(tokenizer, q.question, agent.search, agent.prompt)
        ids, mask, searches = [], [], 0
        turns = [(FIRST.format(query=q.question), hits)] + ([(HOP.format(query=hop), next(hop_hits))] if hop else [])
        for text, found in turns[:agent.max_searches]:
            turn = tokenizer(text, add_special_tokens=False).input_ids
            body = tokenizer(render(found), add_special_tokens=False).input_ids
            room = min(agent.max_info_tokens, agent.max_context_tokens - len(prompt) - len(ids) - len(turn))
            info = head + body[:max(0, room - len(head) - len(tail))] + tail
            ids, mask, searches = ids + turn + info, mask + [1] * len(turn) + [0] * len(info), searches + 1
        answer = q.answers[0]
        last = tokenizer(ANSWER.format(answer=answer), add_special_tokens=False).input_ids
        ids, mask = ids + last, mask + [1] * len(last)
        if len(prompt) + len(ids) > agent.max_context_tokens:
            raise ValueError(f"scripted trajectory for {q.qid} has {len(prompt) + len(ids)} tokens, more than "
                             f"agent.max_context_tokens={agent.max_context_tokens}")
        trajs.append(Trajectory(
            qid=q.qid, group=group_offset + i, prompt_ids=prompt, response_ids=ids, loss_mask=mask,
            logprobs=[0.0] * len(ids), reward=score(answer, list(q.answers), True),
            em=exact_match(answer, list(q.answers)), f1=f1(answer, list(q.answers)), prediction=answer,
            answers=list(q.answers), searches=searches, turns=searches + 1,
            info_tokens=len(mask) - sum(mask), stop_reason="answer",
            response_text=tokenizer.decode(ids, skip_special_tokens=False)))
    return trajs, rollout_metrics(trajs, 0.0, retrieval_s, time.perf_counter() - started)
