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
"""
from __future__ import annotations

from dataclasses import dataclass

from searchr1.checks import _one_of

CHOICES = {"warm_start": ("all", "answerable"), "rl": ("all", "retrievable")}


@dataclass
class CurriculumConfig:
    warm_start: str = "all"  # all | answerable
    rl: str = "all"  # all | retrievable

    def __post_init__(self):
        for stage, choices in CHOICES.items():
            _one_of(f"curriculum.{stage}", getattr(self, stage), choices)


def holds_answer(text: str, answers: list[str]) -> bool:
    """A gold answer occurs in `text` as whole words after HotpotQA's normalisation (the EM rule's view)."""
    from searchr1.reward import normalize_answer

    padded = f" {normalize_answer(text)} "
    return any(f" {a} " in padded for a in map(normalize_answer, answers) if a)


def retrievable(questions: list, search, render) -> list[bool]:
    """Whether the information of one search with the question holds one of its answers."""
    found = search([q.question for q in questions])
    return [holds_answer(render(hits), list(q.answers)) for q, hits in zip(questions, found)]


def answerable(trajectories: list, tokenizer) -> list[bool]:
    """Whether a scripted trajectory's information blocks (its loss-mask-0 tokens) hold one of its answers."""
    return [holds_answer(tokenizer.decode([x for x, m in zip(t.response_ids, t.loss_mask) if not m]), t.answers)
            for t in trajectories]
