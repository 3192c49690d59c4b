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

A yes/no answer (6% of the training pool, 11 of the 200 held-out questions) almost never occurs in a passage as a
word, so both filters drop those questions and the agent never sees one answered: it answers them with a span.
`yes_no=true` counts such a question as within reach when its information holds every supporting paragraph
(a `Doc i(Title: t)` line for each supporting title): the evidence a comparison is decided on.
"""
from __future__ import annotations

from dataclasses import dataclass

from searchr1.checks import _check, _one_of

CHOICES = {"warm_start": ("all", "answerable"), "rl": ("all", "retrievable")}


@dataclass
class CurriculumConfig:
    warm_start: str = "all"  # all | answerable
    rl: str = "all"  # all | retrievable
    yes_no: bool = False  # a yes/no question qualifies when its information holds its supporting paragraphs
    rl_copyable: bool = True  # false: RL's pool drops the questions whose gold answer is a span of the question

    def __post_init__(self):
        for stage, choices in CHOICES.items():
            _one_of(f"curriculum.{stage}", getattr(self, stage), choices)
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
