"""Statistics for claims about learning: paired tests over the same questions, and intervals with counts.

Two evaluations of one held-out set are paired data: each question is answered right or wrong by both. The
exact McNemar test looks only at the discordant questions (right in one, wrong in the other): under the null
hypothesis of no difference each of them is a fair coin, so the two-sided p-value is a binomial tail. With 200
questions a difference of a few points is noise (a single proportion near 50% has a 95% interval of about
+-7 points); comparing question by question is what separates a real change from a lucky draw.

    python -m searchr1.stats A/predictions/step_000020.jsonl B/predictions/step_000020.jsonl
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from fractions import Fraction


def binom_two_sided(k: int, n: int) -> float:
    """P(|X - n/2| >= |k - n/2|) for X ~ Binomial(n, 1/2): the exact two-sided p-value (1.0 for n = 0)."""
    if n == 0:
        return 1.0
    lo = min(k, n - k)
    # exact integers: 2.0**n overflows a float from n = 1,024 discordant questions, and the quotient of two
    # huge floats loses what a small p-value is made of
    tail = Fraction(sum(math.comb(n, i) for i in range(lo + 1)), 2**n)
    return float(min(Fraction(1), 2 * tail))


@dataclass(frozen=True)
class Paired:
    n: int  # questions in both evaluations
    a_correct: int
    b_correct: int
    only_a: int  # right in A, wrong in B
    only_b: int  # right in B, wrong in A
    p_value: float  # exact McNemar, two-sided

    @property
    def delta_points(self) -> float:
        """B's EM minus A's, in percentage points."""
        return 100.0 * (self.b_correct - self.a_correct) / max(self.n, 1)


def mcnemar(a: list[bool], b: list[bool]) -> Paired:
    """Exact McNemar test of two paired lists of outcomes (the same questions, in the same order)."""
    if len(a) != len(b):
        raise ValueError(f"paired outcomes need equal lengths, got {len(a)} and {len(b)}")
    only_a = sum(x and not y for x, y in zip(a, b))
    only_b = sum(y and not x for x, y in zip(a, b))
    return Paired(len(a), sum(map(bool, a)), sum(map(bool, b)), only_a, only_b,
                  binom_two_sided(only_b, only_a + only_b))


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval of a proportion k/n (95% by default), as fractions."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # at k = 0 and k = n the bound is exactly 0 and 1; float rounding would print 0.9999999999999999
    return (0.0 if k == 0 else max(0.0, centre - half)), (1.0 if k == n else min(1.0, centre + half))


def paired_predictions(a: list[dict], b: list[dict], key: str = "em") -> Paired:
    """McNemar over two prediction files' lines (searchr1/evaluation.py), matched by question id; both must
    hold the same questions."""
    by_id = {p["id"]: p for p in b}
    missing = [p["id"] for p in a if p["id"] not in by_id]
    if missing or len(a) != len(b):
        raise ValueError(f"the two evaluations differ in questions ({len(a)} vs {len(b)}; e.g. {missing[:1]})")
    return mcnemar([bool(p[key]) for p in a], [bool(by_id[p["id"]][key]) for p in a])


@dataclass(frozen=True)
class Pooled:
    """Paired evaluations of several runs (seeds, compute dtypes) taken together."""

    runs: int
    only_a: int  # discordant questions right only in A, summed over the runs
    only_b: int
    p_value: float  # exact stratified test: under "no difference" every discordant question of every run is a fair coin
    runs_up: int  # runs whose B has more right than its A
    runs_down: int
    sign_p_value: float  # sign test over the runs (ties dropped): does the direction repeat?
    median_delta_points: float


def pool(results: list[Paired]) -> Pooled:
    """The runs' discordant questions added up: each is a fair coin under the null hypothesis whichever run it
    comes from, so their total is one binomial (the exact stratified McNemar test); and the sign test over runs,
    which asks only whether each run moved the same way. A result that holds across seeds passes both."""
    if not results:
        raise ValueError("pool() needs at least one paired result")
    only_a, only_b = sum(r.only_a for r in results), sum(r.only_b for r in results)
    up = sum(r.b_correct > r.a_correct for r in results)
    down = sum(r.b_correct < r.a_correct for r in results)
    deltas = sorted(r.delta_points for r in results)
    mid = len(deltas) // 2
    median = deltas[mid] if len(deltas) % 2 else (deltas[mid - 1] + deltas[mid]) / 2
    return Pooled(len(results), only_a, only_b, binom_two_sided(only_b, only_a + only_b), up, down,
                  binom_two_sided(up, up + down), median)


def describe(name_a: str, name_b: str, r: Paired) -> str:
    lo_a, hi_a = wilson(r.a_correct, r.n)
    lo_b, hi_b = wilson(r.b_correct, r.n)
    return (f"{name_a}: {r.a_correct}/{r.n} ({100 * r.a_correct / max(r.n, 1):.1f}%, 95% CI {100 * lo_a:.1f}-"
            f"{100 * hi_a:.1f}); {name_b}: {r.b_correct}/{r.n} ({100 * r.b_correct / max(r.n, 1):.1f}%, 95% CI "
            f"{100 * lo_b:.1f}-{100 * hi_b:.1f}); {r.delta_points:+.1f} points; discordant {r.only_a} vs "
            f"{r.only_b}, exact McNemar p = {r.p_value:.3g}")


def _cli(argv: list[str] | None = None) -> int:
    from searchr1.evaluation import read_predictions

    ap = argparse.ArgumentParser(prog="python -m searchr1.stats", description="paired test of two evaluations")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    r = paired_predictions(read_predictions(args.a), read_predictions(args.b))
    print(json.dumps(asdict(r)) if args.json else describe(args.a, args.b, r))
    return 0


if __name__ == "__main__":
    sys.exit(_cli())
