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
