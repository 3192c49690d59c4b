"""The paired test and the intervals that learning claims are reported with, on hand-made cases."""
import math

import pytest

from searchr1.stats import binom_two_sided, mcnemar, paired_predictions, wilson


def test_binomial_tail_by_hand():
    # 10 discordant questions all one way: 2 * (1/2)^10
    assert binom_two_sided(10, 10) == pytest.approx(2 / 1024)
    assert binom_two_sided(0, 10) == pytest.approx(2 / 1024)
    # 8 of 10: 2 * (1 + 10 + 45) / 1024
    assert binom_two_sided(8, 10) == pytest.approx(2 * 56 / 1024)
    assert binom_two_sided(5, 10) == 1.0 and binom_two_sided(0, 0) == 1.0


def test_mcnemar_counts_only_discordant_questions():
    a = [True] * 50 + [False] * 150
    b = [True] * 50 + [True] * 20 + [False] * 130  # 20 more right, none lost
    r = mcnemar(a, b)
    assert (r.n, r.a_correct, r.b_correct, r.only_a, r.only_b) == (200, 50, 70, 0, 20)
    assert r.delta_points == pytest.approx(10.0)
    assert r.p_value == pytest.approx(2 * 0.5**20)
    # the same totals with churn: 25 gained and 5 lost is much weaker evidence
    c = [True] * 45 + [False] * 5 + [True] * 25 + [False] * 125
    r2 = mcnemar(a, c)
    assert (r2.b_correct, r2.only_a, r2.only_b) == (70, 5, 25)
    assert r2.p_value == pytest.approx(2 * sum(math.comb(30, i) for i in range(6)) / 2**30)
    assert r2.p_value > r.p_value
    with pytest.raises(ValueError, match="equal lengths"):
        mcnemar([True], [True, False])


def test_wilson_interval():
    lo, hi = wilson(100, 200)
    assert lo == pytest.approx(0.4314, abs=1e-4) and hi == pytest.approx(0.5686, abs=1e-4)
    assert wilson(0, 200)[0] == pytest.approx(0.0, abs=1e-12) and wilson(0, 200)[1] == pytest.approx(0.0188, abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)


def test_paired_predictions_match_by_question_id():
    a = [{"id": "q1", "em": 1.0}, {"id": "q2", "em": 0.0}, {"id": "q3", "em": 0.0}]
    b = [{"id": "q3", "em": 1.0}, {"id": "q1", "em": 1.0}, {"id": "q2", "em": 1.0}]
    r = paired_predictions(a, b)
    assert (r.a_correct, r.b_correct, r.only_a, r.only_b) == (1, 3, 0, 2)
    with pytest.raises(ValueError, match="differ in questions"):
        paired_predictions(a, b[:2])


def test_pooled_runs_add_their_discordant_questions_and_count_directions():
    from searchr1.stats import pool

    runs = [mcnemar([False] * 10 + [True] * 2, [True] * 10 + [False] * 2),  # 10 gained, 2 lost
            mcnemar([False] * 6 + [True] * 1, [True] * 6 + [False] * 1),  # 6 gained, 1 lost
            mcnemar([True] * 3 + [False] * 4, [False] * 3 + [True] * 4)]  # 4 gained, 3 lost
    p = pool(runs)
    assert (p.runs, p.only_a, p.only_b, p.runs_up, p.runs_down) == (3, 6, 20, 3, 0)
    assert p.p_value == pytest.approx(binom_two_sided(20, 26))
    assert p.sign_p_value == pytest.approx(2 * 0.5**3)
    assert p.median_delta_points == pytest.approx(100 * 8 / 12)  # the runs gained 8/12, 5/7 and 1/7 of their questions
    with pytest.raises(ValueError, match="at least one"):
        pool([])


def test_exact_mcnemar_holds_past_a_thousand_discordant_questions():
    """2.0**n overflowed a float from n = 1,024 (a full dev set reaches that); the test is exact integers."""
    from searchr1.stats import binom_two_sided

    assert binom_two_sided(512, 1024) == 1.0
    assert binom_two_sided(600, 1200) == 1.0
    p = binom_two_sided(450, 1024)  # 62 below the middle: about 3.9 standard deviations
    assert 5e-5 < p < 2e-4
    assert binom_two_sided(0, 2000) == 0.0  # 2 / 2**2000 is below the smallest float: 0, not an error
    a = [True] * 700 + [False] * 400
    b = [False] * 700 + [True] * 400
    assert mcnemar(a, b).p_value < 1e-15


def test_wilson_bounds_are_exact_at_zero_and_all():
    assert wilson(200, 200)[1] == 1.0 and wilson(0, 200)[0] == 0.0
    assert f"{wilson(7, 7)[1]}" == "1.0"
