"""The stages' question pools: what counts as an answer within reach, and that every rank draws the same."""
from dataclasses import dataclass
from pathlib import Path

import pytest

from launch import compose_config
from searchr1 import curriculum
from searchr1.data import load_splits
from searchr1.roles import stage_pools
from searchr1.trajectory import Trajectory

ROOT = Path(__file__).resolve().parent.parent


def test_an_answer_counts_as_whole_words_after_normalisation():
    assert curriculum.holds_answer("Doc 1(Title: X) It is in the United States.", ["the United States"])
    assert curriculum.holds_answer("born in 1961, in Honolulu", ["1961"])
    assert not curriculum.holds_answer("in 19610 cases", ["1961"])  # part of a longer token
    assert not curriculum.holds_answer("anything at all", ["", "the"])  # nothing left after normalisation


@dataclass(frozen=True)
class Q:
    question: str
    answers: tuple
    supporting_facts: tuple = ()


def test_retrievable_reads_what_one_search_with_the_question_returns():
    qs = [Q("who founded x", ("Alice",)), Q("where is y", ("Paris",))]
    found = {"who founded x": ["Alice founded X."], "where is y": ["Y lies in Lyon."]}
    ok = curriculum.retrievable(qs, lambda queries: [found[q] for q in queries], lambda hits: " ".join(hits))
    assert ok == [True, False]


class Tok:
    def decode(self, ids):
        return " ".join({1: "think", 2: "Paris", 3: "answer", 4: "Lyon"}[i] for i in ids)


def test_answerable_reads_only_the_information_blocks():
    def traj(ids, mask):
        return Trajectory(qid="q", group=0, prompt_ids=[0], response_ids=ids, loss_mask=mask, logprobs=[0.0] * len(ids),
                          answers=["Paris"])
    # the gold is in an inserted block (mask 0) / only in the model's own answer turn (mask 1)
    qs = [Q("where", ("Paris",))] * 2
    assert curriculum.answerable(qs, [traj([1, 2, 3], [1, 0, 1]), traj([4, 2], [0, 1])], Tok()) == [True, False]


def test_a_yes_no_question_is_within_reach_only_with_its_evidence_and_only_when_asked():
    both = Q("are a and b both french?", ("no",), (("A", 0), ("B", 1)))
    found = {both.question: "Doc 1(Title: A) A is French.\nDoc 2(Title: B) B is Belgian. no"}
    one = Q("is c french?", ("Yes",), (("C", 0), ("D", 0)))
    found[one.question] = "Doc 1(Title: C) C is French, yes.\nDoc 2(Title: E) E."
    search, render = (lambda queries: [found[q] for q in queries]), (lambda hits: hits)
    # by default a yes/no question is judged like any other: by the word itself (here a stray "no"/"yes")
    assert curriculum.retrievable([both, one], search, render) == [True, True]
    # with yes_no, by the supporting paragraphs: both titles are there for the first, D is missing for the second
    assert curriculum.retrievable([both, one], search, render, yes_no=True) == [True, False]
    assert curriculum.holds_evidence("Doc 1(Title: A) x", ()) is False  # no supporting facts: no evidence
    span = Q("who", ("Alice",), (("A", 0),))  # a span answer keeps the word rule under yes_no
    assert curriculum.informs("Doc 1(Title: A) Bob.", span, yes_no=True) is False


def test_yes_no_without_a_filtered_pool_is_refused_naming_the_key():
    with pytest.raises(SystemExit, match="curriculum.yes_no"):
        compose_config(["curriculum.yes_no=true"])


def test_pools_are_the_same_on_every_rank_and_recorded_by_stage():
    cfg = compose_config(["+experiment=smoke", "curriculum.warm_start=answerable", "curriculum.rl=retrievable"])
    a = stage_pools(load_splits(cfg.data, ROOT), cfg)
    b = stage_pools(load_splits(cfg.data, ROOT), cfg)
    assert set(a.pools) == {"sft", "rl"} and [q.qid for q in a.pool("rl")] == [q.qid for q in b.pool("rl")]
    assert 0 < len(a.pool("rl")) < len(a.train) and 0 < len(a.pool("sft")) <= len(a.train)
    plain = compose_config(["+experiment=smoke"])
    s = stage_pools(load_splits(plain.data, ROOT), plain)
    assert s.pools == {} and s.pool("rl") is s.train


def test_an_unknown_curriculum_is_refused_naming_the_key():
    with pytest.raises(SystemExit, match="curriculum.rl"):
        compose_config(["curriculum.rl=easy"])


def test_a_copyable_question_holds_its_answer_in_its_own_words():
    assert curriculum.copyable(Q("Which canal was longer, the Sandy Canal or the Morris Canal?", ("Morris Canal",)))
    assert not curriculum.copyable(Q("Who founded the firm where Mark Walter is CEO?", ("Todd Boehly",)))
    assert not curriculum.copyable(Q("Is Parisian food good?", ("Paris",)))  # whole words only


def test_rl_copyable_false_drops_them_from_rl_only():
    base = ["+experiment=smoke", "curriculum.warm_start=answerable", "curriculum.rl=retrievable"]
    keep = stage_pools(load_splits(compose_config(base).data, ROOT), compose_config(base))
    cfg = compose_config(base + ["curriculum.rl_copyable=false"])
    drop = stage_pools(load_splits(cfg.data, ROOT), cfg)
    assert [q.qid for q in drop.pool("rl")] == [q.qid for q in keep.pool("rl") if not curriculum.copyable(q)]
    assert [q.qid for q in drop.pool("sft")] == [q.qid for q in keep.pool("sft")]
    # on the whole pool too: the unfiltered warm start keeps the full training set
    whole = compose_config(["+experiment=smoke", "curriculum.rl_copyable=false"])
    s = stage_pools(load_splits(whole.data, ROOT), whole)
    assert set(s.pools) == {"rl"} and s.pool("sft") is s.train
    assert [q.qid for q in s.pool("rl")] == [q.qid for q in s.train if not curriculum.copyable(q)]


@dataclass(frozen=True)
class Measured:
    qid: str


def _rates_file(path, records):
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_pass_rate_file_is_checked_line_by_line_naming_the_file_and_line(tmp_path):
    train = [Measured("q1"), Measured("q2")]
    good = _rates_file(tmp_path / "ok.jsonl", [{"id": "q1", "samples": 8, "correct": 3},
                                               {"id": "q2", "samples": 8, "correct": 0}])
    assert curriculum.read_pass_rates(good, train) == {"q1": (3, 8), "q2": (0, 8)}
    bad = {"not json": "{oops", "a missing field": '{"id": "q1", "samples": 8}',
           "more right than samples": '{"id": "q1", "samples": 4, "correct": 5}',
           "a foreign id": '{"id": "dev_7", "samples": 8, "correct": 1}'}
    for why, line in bad.items():
        f = tmp_path / "bad.jsonl"
        f.write_text('{"id": "q2", "samples": 8, "correct": 1}\n' + line + "\n")
        with pytest.raises(ValueError, match=r"bad.jsonl' line 2") as e:
            curriculum.read_pass_rates(f, train)
        assert "dev_7" in str(e.value) or why != "a foreign id", why
    twice = _rates_file(tmp_path / "twice.jsonl", [{"id": "q1", "samples": 8, "correct": 1}] * 2)
    with pytest.raises(ValueError, match="line 2: id 'q1' appears twice"):
        curriculum.read_pass_rates(twice, train)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="no records"):
        curriculum.read_pass_rates(tmp_path / "empty.jsonl", train)


def test_rl_pass_rate_draws_the_questions_whose_rate_lies_inside_the_band(tmp_path):
    plain = compose_config(["+experiment=smoke"])
    train = load_splits(plain.data, ROOT).train
    correct = [0, 8, 3, 1, 4, 0, 7, 2]  # of 8 samples each, for the first 8 training questions in pool order
    f = _rates_file(tmp_path / "pass_rates.jsonl", [{"id": q.qid, "samples": 8, "correct": c}
                                                    for q, c in zip(train, correct)])
    cfg = compose_config(["+experiment=smoke", "curriculum.rl=pass_rate", f"curriculum.pass_rates={f}"])
    s = stage_pools(load_splits(cfg.data, ROOT), cfg)
    assert [q.qid for q in s.pool("rl")] == [train[i].qid for i in (2, 3, 4, 6, 7)]  # neither 0 nor 8 of 8
    assert s.pool("sft") is s.train  # the warm start's pool is untouched
    low = compose_config(["+experiment=smoke", "curriculum.rl=pass_rate", f"curriculum.pass_rates={f}",
                          "curriculum.pass_rate_max=0.4"])
    assert [q.qid for q in stage_pools(load_splits(low.data, ROOT), low).pool("rl")] == \
        [train[i].qid for i in (2, 3, 7)]


def test_preflight_refuses_a_missing_foreign_or_too_narrow_pass_rate_file(tmp_path):
    from searchr1 import preflight
    from searchr1.checks import ConfigError

    def check(*extra):
        preflight.check(compose_config(["+experiment=smoke", "curriculum.rl=pass_rate", *extra]))

    with pytest.raises(ConfigError, match="curriculum.pass_rates='/no/such.jsonl': no such file"):
        check("curriculum.pass_rates=/no/such.jsonl")
    # measured without a dev split, then used with one: the dev questions are not training questions there
    whole = load_splits(compose_config(["+experiment=smoke"]).data, ROOT).train
    tuned = load_splits(compose_config(["+experiment=smoke", "data.dev_size=20"]).data, ROOT)
    f = _rates_file(tmp_path / "all.jsonl", [{"id": q.qid, "samples": 8, "correct": 4} for q in whole])
    first_dev = next(q.qid for q in whole if q in tuned.dev)
    with pytest.raises(ConfigError, match=f"line {[q.qid for q in whole].index(first_dev) + 1}: id '{first_dev}' "
                                          f"is not a training question of this data config"):
        check(f"curriculum.pass_rates={f}", "data.dev_size=20")
    one = _rates_file(tmp_path / "one.jsonl", [{"id": whole[0].qid, "samples": 8, "correct": 4},
                                              {"id": whole[1].qid, "samples": 8, "correct": 0}])
    with pytest.raises(ConfigError, match=r"1 of its 2 questions have a pass rate in \(0.0, 1.0\), fewer than "
                                          r"algo.questions_per_step=2"):
        check(f"curriculum.pass_rates={one}")
    check(f"curriculum.pass_rates={f}")  # the whole pool measured, every question mixed: accepted
