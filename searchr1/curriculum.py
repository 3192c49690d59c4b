"""Which training questions each stage draws from: the whole pool, or the questions whose answer the index
puts within the agent's reach.

A 135M policy learns from a question only when some of its samples are right and some wrong (a GRPO group with
equal rewards carries no gradient), and it can only be right when the answer is in what it reads: measured on
the dev split's training pool after the warm start, sampled at temperature 0.5, 20% of the samples of questions
whose first search (the question itself) brings the answer were right, and 2% of the others (README, "Tuning").
Both filters read only training questions, their gold answers and this project's own index, never a held-out
question, and they are deterministic, so every rank computes the same pools (searchr1.roles.stage_pools):

- `answerable` (the warm start): the scripted trajectory's information blocks hold a gold answer, so the
  supervised stage teaches reading an answer off the passages rather than reciting one it was never shown.
- `retrievable` (RL): the information of one search with the question holds a gold answer (top_k passages of
  passage_max_tokens each, as the agent sees them).

`rl_copyable=false` also drops from RL's pool the questions whose gold answer occurs in the question itself
(comparisons: "which is longer, A or B?"). There a span copied from the question earns the reward, and on the dev
split RL's policies answered more bridge questions with a span of the question (README, "Questions whose answer is
in the question").

`rl=pass_rate` is offline difficulty filtering (as DAPO, Skywork-OR1 and POLARIS filter before RL): `mode=pass_rate`
samples each question of RL's pool `pass_rate_samples` times with a checkpoint (the warm start's end) at the
sampling temperature and writes `pass_rates.jsonl`; a run with `curriculum.pass_rates=` that file then draws RL's
questions from those whose measured rate lies strictly between `pass_rate_min` and `pass_rate_max` (by default
the ones with some samples right and some wrong: a group of them carries a gradient). The file names questions by
id, and every id must be a training question of the run's data config, so a file measured on dev questions (or on
another split) is refused, not silently used.

A yes/no answer (6% of the training pool, 11 of the 200 held-out questions) almost never occurs in a passage as a
word, so both filters drop those questions and the agent never sees one answered: it answers them with a span.
`yes_no=true` counts such a question as within reach when its information holds every supporting paragraph
(a `Doc i(Title: t)` line for each supporting title): the evidence a comparison is decided on.
"""
from __future__ import annotations

from dataclasses import dataclass

from searchr1.checks import _check, _one_of

CHOICES = {"warm_start": ("all", "answerable"), "rl": ("all", "retrievable", "pass_rate")}


@dataclass
class CurriculumConfig:
    warm_start: str = "all"  # all | answerable
    rl: str = "all"  # all | retrievable | pass_rate
    yes_no: bool = False  # a yes/no question qualifies when its information holds its supporting paragraphs
    rl_copyable: bool = True  # false: RL's pool drops the questions whose gold answer is a span of the question
    pass_rates: str = ""  # rl=pass_rate: a pass_rates.jsonl written by mode=pass_rate
    pass_rate_min: float = 0.0  # rl=pass_rate keeps the questions whose rate is > min and < max
    pass_rate_max: float = 1.0
    pass_rate_samples: int = 8  # mode=pass_rate: samples per question (a group's size: mixed means a gradient)

    def __post_init__(self):
        for stage, choices in CHOICES.items():
            _one_of(f"curriculum.{stage}", getattr(self, stage), choices)
        _check(self.rl != "pass_rate" or bool(self.pass_rates), "curriculum.pass_rates", self.pass_rates,
               "required with curriculum.rl=pass_rate (a pass_rates.jsonl written by mode=pass_rate)")
        _check(not self.pass_rates or self.rl == "pass_rate", "curriculum.pass_rates", self.pass_rates,
               f"only read with curriculum.rl=pass_rate (curriculum.rl={self.rl})")
        _check(0.0 <= self.pass_rate_min < self.pass_rate_max <= 1.0, "curriculum.pass_rate_min",
               self.pass_rate_min, f"must satisfy 0 <= pass_rate_min < pass_rate_max <= 1 "
                                   f"(pass_rate_max={self.pass_rate_max})")
        _check(self.pass_rate_samples >= 1, "curriculum.pass_rate_samples", self.pass_rate_samples, "must be >= 1")
        _check(not self.yes_no or (self.warm_start, self.rl) != ("all", "all"), "curriculum.yes_no", self.yes_no,
               "applies to a filtered pool: set curriculum.warm_start=answerable or curriculum.rl=retrievable")


def holds_answer(text: str, answers: list[str]) -> bool:
    """A gold answer occurs in `text` as whole words after HotpotQA's normalisation (the EM rule's view)."""
    from searchr1.reward import normalize_answer

    padded = f" {normalize_answer(text)} "
    return any(f" {a} " in padded for a in map(normalize_answer, answers) if a)


def copyable(question) -> bool:
    """A gold answer occurs in the question itself (as `holds_answer` reads text): copying earns the reward."""
    return holds_answer(question.question, list(question.answers))


def is_yes_no(answers) -> bool:
    from searchr1.reward import normalize_answer

    return bool(answers) and all(normalize_answer(a) in ("yes", "no") for a in answers)


def holds_evidence(text: str, supporting_facts) -> bool:
    """Every supporting paragraph's title heads a passage of `text` (format_passages' 'Doc i(Title: t)')."""
    return bool(supporting_facts) and all(f"(Title: {title})" in text for title, _ in supporting_facts)


def informs(text: str, question, yes_no: bool = False) -> bool:
    """Whether `text` puts the question's answer within reach: the answer itself, or with `yes_no` the supporting
    paragraphs of a yes/no question."""
    if yes_no and is_yes_no(question.answers):
        return holds_evidence(text, question.supporting_facts)
    return holds_answer(text, list(question.answers))


def retrievable(questions: list, search, render, yes_no: bool = False) -> list[bool]:
    """Whether the information of one search with the question puts its answer within reach (`informs`)."""
    found = search([q.question for q in questions])
    return [informs(render(hits), q, yes_no) for q, hits in zip(questions, found)]


def answerable(questions: list, trajectories: list, tokenizer, yes_no: bool = False) -> list[bool]:
    """Whether a question's scripted trajectory's information blocks (its loss-mask-0 tokens) put its answer within
    reach (`informs`)."""
    return [informs(tokenizer.decode([x for x, m in zip(t.response_ids, t.loss_mask) if not m]), q, yes_no)
            for q, t in zip(questions, trajectories, strict=True)]


def read_pass_rates(path, train: list) -> dict[str, tuple[int, int]]:
    """`mode=pass_rate`'s file: question id -> (correct, samples), each line checked; every id must be one of the
    `train` questions (ValueError naming the file, the line and the value otherwise)."""
    import json
    from pathlib import Path

    ids, out = {q.qid for q in train}, {}
    for n, line in enumerate(Path(path).expanduser().read_text().splitlines(), 1):
        where = f"curriculum.pass_rates={str(path)!r} line {n}"
        try:
            rec = json.loads(line)
            qid, k, correct = rec["id"], rec["samples"], rec["correct"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{where}: not a pass-rate record {{id, samples, correct}} ({e})") from None
        if not (isinstance(k, int) and isinstance(correct, int) and 0 <= correct <= k and k > 0):
            raise ValueError(f"{where}: samples={k!r}, correct={correct!r}: need integers 0 <= correct <= samples, "
                             f"samples > 0")
        if qid not in ids:
            raise ValueError(f"{where}: id {qid!r} is not a training question of this data config (a file "
                             f"measured on other questions, e.g. the dev split's?)")
        if qid in out:
            raise ValueError(f"{where}: id {qid!r} appears twice")
        out[qid] = (correct, k)
    if not out:
        raise ValueError(f"curriculum.pass_rates={str(path)!r}: no records")
    return out


def within_pass_rate(train: list, rates: dict[str, tuple[int, int]], low: float, high: float) -> list:
    """The `train` questions measured with a pass rate strictly between `low` and `high`, in pool order."""
    return [q for q in train if q.qid in rates and low < rates[q.qid][0] / rates[q.qid][1] < high]


def pass_rate_pool(c: CurriculumConfig, train: list) -> list:
    """RL's pool under `rl=pass_rate`: `c.pass_rates` read against `train`, the questions inside the band."""
    return within_pass_rate(train, read_pass_rates(c.pass_rates, train), c.pass_rate_min, c.pass_rate_max)
