import pytest

from searchr1.reward import em_reward, exact_match, f1, f1_reward, make_score, normalize_answer


@pytest.mark.parametrize("raw, norm", [
    ("The Beatles", "beatles"),
    ("  an   Apple a day ", "apple day"),
    ("U.S.A.", "usa"),
    ("Smith's, Jr.", "smiths jr"),
    ("theatre", "theatre"),  # articles only as whole words
    ("Beyoncé", "beyoncé"),  # unicode letters are kept and lower-cased
    ("Rock–Paper", "rock–paper"),  # unicode dash is not ASCII punctuation: kept, as in the official script
    ("", ""),
])
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


def test_exact_match_punctuation_articles_case_and_aliases():
    assert exact_match("the Eiffel Tower.", ["Eiffel Tower"]) == 1.0
    assert exact_match("BEYONCÉ", ["Beyoncé"]) == 1.0
    assert exact_match("1,000", ["1000"]) == 1.0
    assert exact_match("Paris", ["Lyon", "paris!"]) == 1.0
    assert exact_match("Paris France", ["Paris"]) == 0.0
    assert exact_match(None, ["Paris"]) == 0.0


def test_f1_partial_and_best_alias():
    assert f1("Barack Obama", ["Obama"]) == pytest.approx(2 / 3)
    assert f1("the president Barack Obama", ["Obama", "Barack Obama"]) == pytest.approx(0.8)
    assert f1("nothing shared", ["Obama"]) == 0.0
    assert f1(None, ["Obama"]) == 0.0


def test_f1_yes_no_rule():
    assert f1("yes", ["yes"]) == 1.0
    assert f1("Yes.", ["yes"]) == 1.0
    assert f1("yes it is", ["yes"]) == 0.0  # gold is closed-class and differs: no partial credit
    assert f1("no", ["no way"]) == 0.0  # prediction is closed-class and differs
    assert f1("noanswer", ["no answer"]) == 0.0


def test_f1_counts_repeated_tokens_once_each():
    assert f1("new new york", ["new york"]) == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))


def test_reward_em_and_format():
    assert em_reward("Paris", ["paris"]) == 1.0
    assert em_reward("Lyon", ["paris"]) == 0.0
    assert em_reward(None, ["paris"], format_score=0.1) == 0.0
    assert em_reward("Lyon", ["paris"], format_score=0.1) == 0.1
    assert em_reward("Lyon", ["paris"], format_score=0.1, well_formed=False) == 0.0
    assert em_reward("Paris", ["paris"], format_score=0.1, well_formed=False) == 1.0


def test_f1_reward_gives_partial_credit_and_the_format_score_only_at_zero():
    assert f1_reward("New York City", ["new york"]) == pytest.approx(0.8)
    assert f1_reward("Boston", ["new york"], format_score=0.1) == 0.1
    assert f1_reward("Boston", ["new york"], format_score=0.1, well_formed=False) == 0.0
    assert f1_reward(None, ["new york"], format_score=0.1) == 0.0


def test_make_score_binds_the_reward_config():
    score = make_score("em", 0.1)
    assert (score("Paris", ["paris"], True), score("Lyon", ["paris"], True), score(None, ["paris"], True)) == (1.0, 0.1, 0.0)
    assert make_score("f1", 0.0)("new york city", ["new york"], True) == pytest.approx(0.8)
    assert make_score("em", 0.0, -1.0)("Paris", ["paris"], True) == -1.0  # the flipped-sign control
    with pytest.raises(ValueError, match="reward.name"):
        make_score("bleu", 0.0)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="format_score"):
        em_reward("a", ["a"], format_score=1.5)
    with pytest.raises(ValueError, match="gold"):
        exact_match("a", [])
