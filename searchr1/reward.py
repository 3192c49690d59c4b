"""Answer scoring by the official HotpotQA rules, and the training reward built on it.

Normalisation (as in HotpotQA's `hotpot_evaluate_v1.py`): lower-case, delete ASCII punctuation
(`string.punctuation` only: unicode dashes and quotes stay, as in the official script), replace the words
a/an/the by a space, collapse white space. A prediction is scored against every gold alias and keeps the best.

Token F1 follows the official yes/no/noanswer rule: when either side normalises to one of those three words
and the two sides differ, F1 is 0 (no partial credit for "yes" against "yes it is").
"""
from __future__ import annotations

import re
import string
from collections import Counter
from typing import Callable, Optional

_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_CLOSED_CLASS = frozenset({"yes", "no", "noanswer"})


def normalize_answer(s: str) -> str:
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _golds(golds: list[str] | str) -> list[str]:
    golds = [golds] if isinstance(golds, str) else list(golds)
    if not golds:
        raise ValueError("no gold answers to score against (an empty `answers` list)")
    return golds


def exact_match(pred: str | None, golds: list[str] | str) -> float:
    """1.0 when the normalised prediction equals some normalised gold alias; a missing prediction scores 0."""
    golds = _golds(golds)
    if pred is None:
        return 0.0
    p = normalize_answer(pred)
    return float(any(p == normalize_answer(g) for g in golds))


def _f1_one(p: str, g: str) -> float:
    if (p in _CLOSED_CLASS or g in _CLOSED_CLASS) and p != g:
        return 0.0
    return overlap_f1(p.split(), g.split())


def overlap_f1(p_toks: list[str], g_toks: list[str]) -> float:
    """Token-overlap F1 of two normalised token lists (every official script's; searchr1/datasets/scoring.py too)."""
    same = sum((Counter(p_toks) & Counter(g_toks)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p_toks), same / len(g_toks)
    return 2 * precision * recall / (precision + recall)


def f1(pred: str | None, golds: list[str] | str) -> float:
    """Best token F1 over the gold aliases; a missing prediction scores 0."""
    golds = _golds(golds)
    if pred is None:
        return 0.0
    p = normalize_answer(pred)
    return max(_f1_one(p, normalize_answer(g)) for g in golds)


Score = Callable[[Optional[str], list, bool], float]  # (prediction, gold aliases, well formed) -> reward


def em_reward(pred: str | None, golds: list[str] | str, format_score: float = 0.0, well_formed: bool = True) -> float:
    """Exact match of the final answer (Search-R1's outcome reward).

    A wrong answer earns `format_score` when it was well formed (an <answer> given, no malformed-output rule
    broken); no answer earns 0. With format_score=0 (the default) this is pure EM.
    """
    _check_format_score(format_score)
    if pred is None:
        return 0.0
    if exact_match(pred, golds):
        return 1.0
    return format_score if well_formed else 0.0


def f1_reward(pred: str | None, golds: list[str] | str, format_score: float = 0.0, well_formed: bool = True) -> float:
    """Token F1 of the final answer; a well-formed answer sharing no token with the gold earns `format_score`."""
    _check_format_score(format_score)
    if pred is None:
        return 0.0
    score = f1(pred, golds)
    return score if score > 0 else (format_score if well_formed else 0.0)


def _check_format_score(format_score: float) -> None:
    if not 0.0 <= format_score < 1.0:
        raise ValueError(f"reward.format_score={format_score!r}: must be in [0, 1) so that a correct answer "
                         "scores most")


def make_score(name: str, format_score: float, scale: float = 1.0) -> Score:
    """The reward `reward.name` selects (searchr1.registry.REWARDS), with its format score and scale bound."""
    from searchr1.registry import REWARDS, resolve

    fn = resolve(REWARDS, name, "reward.name")
    _check_format_score(format_score)
    return lambda pred, golds, well_formed: scale * fn(pred, golds, format_score, well_formed)
