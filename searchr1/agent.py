"""The Search-R1 protocol: prompt, tag parsing and the multi-turn loop that turns questions into Trajectories.

A trajectory is token ids only: the chat-templated prompt, then each turn's generated ids exactly as the engine
produced them (a stop string may end inside a token: the token is kept, the text is parsed), then each
`\\n\\n<information>...</information>\\n\\n` block's ids. Nothing is re-tokenised. The loss mask is 1 exactly on
generated ids; log-probs are the engine's on those ids and 0.0 on inserted ones.

Each turn stops at `</search>` or `</answer>` (or EOS). A trajectory may search `max_searches` times; the turn
after the last allowed search is the final one. The text of one turn is parsed by these rules (names are what
`Trajectory.malformed` and the `rollout/malformed_total/<rule>` metrics count):

- answer: the turn closes `</answer>`: the prediction is the text after the last `<answer>` before it, stripped.
  The trajectory ends ("answer").
    - `text_after_answer`: non-blank text after `</answer>` in the same turn (it can only come from the last
      token): counted, the answer still stands.
    - `empty_answer`: `<answer></answer>` with only blanks inside: no prediction.
- search: the turn closes `</search>` first: the query is the text after the last `<search>` before it.
    - `multiple_search`: several `<search>` opened before the close: counted, the last one is the query.
    - `empty_query`: a blank query: counted; it uses up a search and the information block says so (the
      retriever is not called).
    - `search_over_limit`: a search when no search is left (the final turn, or agent.search=false): the
      trajectory ends ("max_searches") without an answer.
- `unopened_tag`: a `</search>` or `</answer>` with no opening tag before it: ends ("malformed"), no answer.
- `unclosed_tag`: the turn ended (EOS or length) inside an open `<search>` or `<answer>`: ends, no answer.
- `no_tags`: the turn ended with none of `<think>`, `<search>`, `<answer>`: ends, no answer.
- `no_action`: the turn ended with tags (say a closed `<think>`) but neither a search nor an answer: ends.
- `model_information`: the model wrote `<information>` itself: counted only (the model must not invent it).

With `force_answer`, the information block of the last allowed search is followed by `<answer>`, inserted like
the information (loss mask 0, log-prob 0.0): the final turn is parsed as if the model had opened the tag, so it
ends in an answer (or a malformed turn) instead of `search_over_limit`.

Limits end a trajectory cleanly, scored as it stands: `max_new_tokens` (a turn that hit the per-turn cap
without finishing an action), `max_context` (prompt + response would pass `max_context_tokens`: the turn is cut
at the budget and the information block shortened to what fits). The answer counted is the last `<answer>`
of the model's own output (the prompt's example answer never counts, as only generated text is parsed).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable

from searchr1.config import AgentConfig, SamplingConfig
from searchr1.engines.base import Engine, Sampling
from searchr1.registry import PROMPTS
from searchr1.reward import Score, exact_match, f1
from searchr1.trajectory import Trajectory

SEARCH_INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: {question}\n")
DIRECT_INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first. Then provide the "
    "answer inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing "
    "</answer>. Question: {question}\n")
STOPS = ["</search>", "</answer>"]
INFO_HEAD, INFO_TAIL = "\n\n<information>", "</information>\n\n"
ANSWER_CUE = "<answer>"  # agent.force_answer's opening of the final turn
EMPTY_QUERY_INFO = "No results: the search query was empty."
MALFORMED_RULES = ("text_after_answer", "empty_answer", "multiple_search", "empty_query", "search_over_limit",
                   "unopened_tag", "unclosed_tag", "no_tags", "no_action", "model_information")
STOP_REASONS = ("answer", "eos", "max_searches", "max_new_tokens", "max_context", "malformed")
_SEED_STRIDE = 100_003  # per-turn seed offset; larger than any batch so turns never reuse a row's seed


# A worked example for small models: measured on SmolLM2-135M-Instruct (8 training questions, greedy), the bare
# instruction gave 0/8 turns with a search or an answer, the example plus an opened <think> gave 3/8. Without a
# single well-formed sample a group's rewards are all equal and GRPO has no signal to learn from.
SEARCH_EXAMPLE = (
    "Example:\nQuestion: Which city hosts the headquarters of the company that makes the iPhone?\n"
    "<think> The iPhone is made by Apple. I need the city of Apple's headquarters. </think>\n"
    "<search> Apple headquarters city </search>\n<information>Doc 1(Title: Apple Park) Apple Park is the "
    "corporate headquarters of Apple Inc., in Cupertino, California.</information>\n"
    "<think> Apple is headquartered in Cupertino. </think>\n<answer> Cupertino </answer>\n\n")
DIRECT_EXAMPLE = (
    "Example:\nQuestion: Which city hosts the headquarters of the company that makes the iPhone?\n"
    "<think> The iPhone is made by Apple, which is headquartered in Cupertino. </think>\n"
    "<answer> Cupertino </answer>\n\n")


def plain_prefix(tokenizer) -> str:
    """What a prompt without a chat template starts with: a base model's <bos> (Gemma-3-270M's tokenizer does not
    add it), as Search-R1 prompts base models with the plain instruction; nothing where a template renders it."""
    return "" if getattr(tokenizer, "chat_template", None) else (tokenizer.bos_token or "")


def build_prompt(tokenizer, question: str, search: bool = True, style: str = "search_r1") -> list[int]:
    """The Search-R1 instruction as one user message in the model's own chat template (plain text without one).

    style=search_r1_example adds one worked example before the question and opens the assistant turn with
    `<think>`; those prompt tokens are never trained on (the loss mask covers generated tokens only)."""
    if style not in PROMPTS:
        raise ValueError(f"agent.prompt={style!r}: must be one of {PROMPTS}")
    template = SEARCH_INSTRUCTION if search else DIRECT_INSTRUCTION
    if style == "search_r1_example":
        template = template.replace("Question: {question}",
                                    (SEARCH_EXAMPLE if search else DIRECT_EXAMPLE) + "Question: {question}")
    text = template.format(question=question.strip())
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 tokenize=False)
    else:
        rendered = plain_prefix(tokenizer) + text
    if style == "search_r1_example":
        rendered += "<think>"
    return tokenizer(rendered, add_special_tokens=False).input_ids


@dataclass(frozen=True)
class Action:
    kind: str  # "search" | "answer" | "none"
    content: str | None = None  # the query or the answer
    malformed: tuple[str, ...] = ()


def parse_turn(text: str) -> Action:
    """Apply the module's rules to one turn's generated text."""
    flags = ("model_information",) if "<information>" in text else ()
    close_s, close_a = text.find("</search>"), text.find("</answer>")
    if close_s < 0 and close_a < 0:
        if "<search>" in text or "<answer>" in text:
            return Action("none", None, flags + ("unclosed_tag",))
        if "<think>" in text or "</think>" in text:
            return Action("none", None, flags + ("no_action",))
        return Action("none", None, flags + ("no_tags",))
    if close_a >= 0 and (close_s < 0 or close_a < close_s):
        start = text.rfind("<answer>", 0, close_a)
        if start < 0:
            return Action("none", None, flags + ("unopened_tag",))
        answer = text[start + len("<answer>"):close_a].strip()
        if text[close_a + len("</answer>"):].strip():
            flags += ("text_after_answer",)
        if not answer:
            return Action("answer", None, flags + ("empty_answer",))
        return Action("answer", answer, flags)
    head = text[:close_s]
    opened = head.count("<search>")
    if opened == 0:
        return Action("none", None, flags + ("unopened_tag",))
    if opened > 1:
        flags += ("multiple_search",)
    query = head[head.rfind("<search>") + len("<search>"):].strip()
    return Action("search", query, flags if query else flags + ("empty_query",))


@dataclass
class _Episode:
    qid: str
    group: int
    answers: list[str]
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    searches: int = 0
    turns: int = 0
    turn_versions: list[int] = field(default_factory=list)  # weights version of each generated turn
    info_tokens: int = 0
    stop_reason: str = ""  # empty while the episode is still running
    forced: bool = False  # the agent opened this episode's final turn with ANSWER_CUE
    prediction: str | None = None
    malformed: list[str] = field(default_factory=list)

    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


def _insert_info(ep: _Episode, head: list[int], body: list[int], tail: list[int], cfg: AgentConfig) -> None:
    room = min(cfg.max_info_tokens, cfg.max_context_tokens - ep.length())
    keep = room - len(head) - len(tail)
    if keep < 0:
        ep.stop_reason = "max_context"
        return
    ids = head + body[:keep] + tail
    _insert(ep, ids)
    ep.info_tokens += len(ids)
    if ep.length() >= cfg.max_context_tokens:
        ep.stop_reason = "max_context"


def _insert_cue(ep: _Episode, cue: list[int], cfg: AgentConfig) -> None:
    if ep.length() + len(cue) >= cfg.max_context_tokens:
        ep.stop_reason = "max_context"
        return
    _insert(ep, cue)
    ep.forced = True


def _insert(ep: _Episode, ids: list[int]) -> None:
    """Tokens the agent puts into the context, not the model: never trained on, log-prob 0.0."""
    ep.response_ids += ids
    ep.loss_mask += [0] * len(ids)
    ep.logprobs += [0.0] * len(ids)


def _end_without_action(ep: _Episode, finish_reason: str) -> None:
    ep.stop_reason = {"eos": "eos", "length": "max_new_tokens"}.get(finish_reason, "malformed")


@dataclass
class Partial:
    """Partial rollouts (schedule.partial_tokens): a step's generation may end with groups unfinished, which
    wait, every turn kept with its version, and go on in the next call before its new questions (PipelineRL's
    in-flight updates, AReaL's interruptible generation). Owned by the caller across calls.

    Once a call has generated `tokens` tokens and at least one group is complete, every unfinished group that
    `may_carry(oldest version among its turns)` allows is set aside; the others (those the lag bound would not
    admit a step later) run to their end in this call. A group is carried whole, since its advantages need all of
    its samples; a carried group's number grows by `group_stride` (the questions of one step), so that it never
    shares a number with the next call's groups."""

    tokens: int
    group_stride: int
    may_carry: Callable[[int], bool] = lambda version: False
    carried: list = field(default_factory=list)  # the set-aside episodes (_Episode), in order
    carried_in: int = 0  # groups of the last call that had been carried into it and finished there
    carried_out: int = 0  # groups of the last call set aside for the next


def _group_oldest(group: list[_Episode]) -> int:
    return min(v for ep in group for v in ep.turn_versions)


def run_episodes(engine: Engine, questions: list, group_size: int, retrieve: Callable[[list[str]], list[str]],
                 cfg: AgentConfig, sampling: Sampling, score: Score, version: Callable[[], int] = lambda: 0,
                 group_offset: int = 0, partial: Partial | None = None) -> tuple[list[Trajectory], dict[str, float]]:
    """`group_size` trajectories per question, all advanced together turn by turn.

    Each turn is one engine call over every running trajectory and at most one `retrieve` call over all of
    their queries. `sampling.max_new_tokens` caps each turn (use `sampling_for`); its stop strings are
    replaced by the protocol's. Trajectory i*group_size+j is sample j of question i, in group group_offset+i.
    `score(prediction, golds, well_formed)` is the reward. `version()` is asked before every turn: the weights
    version that turn is generated with (a schedule may apply new weights between turns), recorded per turn.
    With `partial`, the episodes it carries go first and it may set groups aside (`Partial`): only complete
    groups are returned.
    """
    if group_size < 1:
        raise ValueError(f"group_size={group_size!r}: must be >= 1")
    tok = engine.tokenizer
    started = time.perf_counter()
    episodes = list(partial.carried) if partial else []
    carried_groups = {ep.group for ep in episodes}
    for i, q in enumerate(questions):
        prompt = build_prompt(tok, q.question, cfg.search, cfg.prompt)
        episodes += [_Episode(q.qid, group_offset + i, list(q.answers), prompt) for _ in range(group_size)]
    if len({ep.group for ep in episodes}) * group_size != len(episodes):
        raise ValueError(f"a carried group shares its number with a new one (groups {sorted(carried_groups)}, "
                         f"new from {group_offset}): Partial.group_stride must be at least a step's questions")
    aside: set[int] = set()  # groups set aside for the next call
    generated, cut = 0, partial is None or partial.tokens <= 0
    head = tok(INFO_HEAD, add_special_tokens=False).input_ids
    tail = tok(INFO_TAIL, add_special_tokens=False).input_ids
    cue = tok(ANSWER_CUE, add_special_tokens=False).input_ids
    generation_s = retrieval_s = 0.0
    turn = 0
    while True:
        for ep in episodes:
            if not ep.stop_reason and ep.length() >= cfg.max_context_tokens:
                ep.stop_reason = "max_context"
        active = [ep for ep in episodes if not ep.stop_reason and ep.group not in aside]
        if not active:
            break
        turn_sampling = replace(sampling, stop=list(STOPS),
                                seed=None if sampling.seed is None else sampling.seed + turn * _SEED_STRIDE)
        now = version()
        t0 = time.perf_counter()
        gens = engine.generate([ep.prompt_ids + ep.response_ids for ep in active], turn_sampling)
        generation_s += time.perf_counter() - t0
        searching = []
        for ep, gen in zip(active, gens):
            budget = cfg.max_context_tokens - ep.length()
            ids, lps = gen.token_ids[:budget], gen.logprobs[:budget]
            generated += len(ids)
            ep.response_ids += ids
            ep.loss_mask += [1] * len(ids)
            ep.logprobs += lps
            ep.turns += 1
            ep.turn_versions.append(now)
            if len(ids) < len(gen.token_ids):
                ep.stop_reason = "max_context"
                continue
            action = parse_turn((ANSWER_CUE if ep.forced else "") + tok.decode(ids, skip_special_tokens=True))
            ep.malformed += action.malformed
            if action.kind == "answer":
                ep.prediction, ep.stop_reason = action.content, "answer"
            elif action.kind == "none":
                _end_without_action(ep, gen.finish_reason)
            elif not cfg.search or ep.searches >= cfg.max_searches:
                ep.malformed.append("search_over_limit")
                ep.stop_reason = "max_searches"
            else:
                ep.searches += 1
                searching.append((ep, action.content))
        queries = [q for _, q in searching if q]
        infos = []
        if queries:
            t0 = time.perf_counter()
            infos = retrieve(queries)
            retrieval_s += time.perf_counter() - t0
            if len(infos) != len(queries):
                raise ValueError(f"retrieve returned {len(infos)} results for {len(queries)} queries")
        found = iter(infos)
        bodies = [next(found) if q else EMPTY_QUERY_INFO for _, q in searching]
        if bodies:
            body_ids = tok(bodies, add_special_tokens=False).input_ids
            for (ep, _), ids in zip(searching, body_ids):
                _insert_info(ep, head, ids, tail, cfg)
                if cfg.force_answer and ep.searches >= cfg.max_searches and not ep.stop_reason:
                    _insert_cue(ep, cue, cfg)
        turn += 1
        if not cut and generated >= partial.tokens:
            aside, cut = _set_aside(episodes, partial)
    trajectories = [_finish(ep, tok, score) for ep in episodes if ep.group not in aside]
    if partial:
        partial.carried = [ep for ep in episodes if ep.group in aside]
        for ep in partial.carried:
            ep.group += partial.group_stride
        partial.carried_in, partial.carried_out = len(carried_groups - aside), len(aside)
    return trajectories, rollout_metrics(trajectories, generation_s, retrieval_s, time.perf_counter() - started)


def _set_aside(episodes: list[_Episode], partial: Partial) -> tuple[set[int], bool]:
    """Once the budget is spent: the unfinished groups that the lag bound lets wait, and whether the cut is made.
    It waits for a complete group, so that a call never returns nothing."""
    groups: dict[int, list[_Episode]] = {}
    for ep in episodes:
        groups.setdefault(ep.group, []).append(ep)
    complete = {gid for gid, g in groups.items() if all(ep.stop_reason for ep in g)}
    if not complete:
        return set(), False
    return {gid for gid, g in groups.items() if gid not in complete and partial.may_carry(_group_oldest(g))}, True


def _finish(ep: _Episode, tok, score: Score) -> Trajectory:
    return Trajectory(
        qid=ep.qid, group=ep.group, prompt_ids=ep.prompt_ids, response_ids=ep.response_ids,
        loss_mask=ep.loss_mask, logprobs=ep.logprobs, reward=score(ep.prediction, ep.answers, not ep.malformed),
        em=exact_match(ep.prediction, ep.answers), f1=f1(ep.prediction, ep.answers), prediction=ep.prediction,
        answers=ep.answers, searches=ep.searches, turns=ep.turns, info_tokens=ep.info_tokens,
        stop_reason=ep.stop_reason, malformed=ep.malformed,
        response_text=tok.decode(ep.response_ids, skip_special_tokens=False), turn_versions=ep.turn_versions)


def sampling_for(agent: AgentConfig, sampling: SamplingConfig, greedy: bool = False, seed: int | None = None
                 ) -> Sampling:
    """The engine's sampling settings for one agent turn; greedy for evaluation."""
    return Sampling(temperature=0.0 if greedy else sampling.temperature, top_p=1.0 if greedy else sampling.top_p,
                    max_new_tokens=agent.max_new_tokens, stop=list(STOPS), seed=seed)


def trajectory_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """Statistics of a set of trajectories, the same keys every time: `_total` keys are sums over the set, every
    other one a mean per trajectory (fractions for stop reasons)."""
    n = max(len(trajs), 1)
    generated = sum(t.generated_tokens for t in trajs)
    m = {
        "rollout/trajectories_total": float(len(trajs)),
        "rollout/generated_tokens_total": float(generated),
        "rollout/reward": sum(t.reward for t in trajs) / n,
        "rollout/em": sum(t.em for t in trajs) / n,
        "rollout/f1": sum(t.f1 for t in trajs) / n,
        "rollout/answer_rate": sum(t.prediction is not None for t in trajs) / n,
        "rollout/searches": sum(t.searches for t in trajs) / n,
        "rollout/searched_rate": sum(t.searches > 0 for t in trajs) / n,
        "rollout/turns": sum(t.turns for t in trajs) / n,
        "rollout/generated_tokens": generated / n,
        "rollout/info_tokens": sum(t.info_tokens for t in trajs) / n,
        "rollout/response_tokens": sum(len(t.response_ids) for t in trajs) / n,
        "rollout/truncated": sum(t.stop_reason in ("max_new_tokens", "max_context") for t in trajs) / n,
        "rollout/malformed_rate": sum(bool(t.malformed) for t in trajs) / n,
    }
    for reason in STOP_REASONS:
        m[f"rollout/stop/{reason}"] = sum(t.stop_reason == reason for t in trajs) / n
    for rule in MALFORMED_RULES:
        m[f"rollout/malformed_total/{rule}"] = float(sum(t.malformed.count(rule) for t in trajs))
    return m


def rollout_metrics(trajs: list[Trajectory], generation_s: float, retrieval_s: float, total_s: float
                    ) -> dict[str, float]:
    """`trajectory_metrics` plus the seconds the batch took (generating, retrieving, in all) and its speed."""
    generated = sum(t.generated_tokens for t in trajs)
    return {**trajectory_metrics(trajs), "rollout/generation_s": generation_s, "rollout/retrieval_s": retrieval_s,
            "rollout/total_s": total_s,
            "rollout/generated_tokens_per_s": generated / total_s if total_s > 0 else 0.0}
