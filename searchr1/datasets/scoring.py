"""Answer scoring as each dataset's official script defines it.

Every script normalises the same way (SQuAD's `normalize_answer`: lower-case, delete ASCII punctuation, replace
a/an/the by a space, collapse white space; searchr1.reward.normalize_answer is that function) and takes the best
score over the gold aliases. They differ in token F1 only:
- HotpotQA (`hotpot_evaluate_v1.py`) and 2WikiMultihopQA (`2wikimultihop_evaluate_v1.1.py`, copied from it):
  F1 is 0 when either side normalises to yes, no or noanswer and the two differ (searchr1.reward.f1).
- MuSiQue (`metrics/answer.py`, SQuAD 2.0's `compute_f1`): the golds are `answer` plus `answer_aliases`; when
  either side normalises to no tokens, F1 is 1 if both do, else 0.
- NQ-open (Search-R1's `qa_em.py` and DPR: SQuAD 1.1's `f1_score`): no special case; no common token is 0.
A missing prediction (no <answer>) scores 0 everywhere.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from searchr1.reward import exact_match, f1 as hotpot_f1, normalize_answer, overlap_f1

Metric = Callable[[Optional[str], Sequence[str]], float]  # (prediction, gold aliases) -> score in [0, 1]


def _golds(golds: Sequence[str] | str) -> list[str]:
    golds = [golds] if isinstance(golds, str) else list(golds)
    if not golds:
        raise ValueError("no gold answers to score against (an empty `answers` list)")
    return golds


def squad1_f1(pred: str | None, golds: Sequence[str] | str) -> float:
    """SQuAD 1.1's f1_score, best over the golds (NQ-open)."""
    golds = _golds(golds)
    if pred is None:
        return 0.0
    p = normalize_answer(pred).split()
    return max(overlap_f1(p, normalize_answer(g).split()) for g in golds)


def squad2_f1(pred: str | None, golds: Sequence[str] | str) -> float:
    """SQuAD 2.0's compute_f1, best over the golds (MuSiQue): an empty side scores 1 only against an empty side."""
    golds = _golds(golds)
    if pred is None:
        return 0.0
    p = normalize_answer(pred).split()
    best = 0.0
    for g in golds:
        g_toks = normalize_answer(g).split()
        score = float(p == g_toks) if not p or not g_toks else overlap_f1(p, g_toks)
        best = max(best, score)
    return best


EM: Metric = exact_match  # every set: normalised equality with some gold alias
HOTPOT_F1: Metric = hotpot_f1
