"""The other held-out sets (searchr1/datasets): each reader against hand-checked records of its shipped file, the
strictness of each reader, each set's official answer scoring, the seeded held-out samples, the corpora, the
overlap check against training questions, and the config key `data.eval_sets`."""
import gzip
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import launch  # noqa: E402  (registers the schema)
from searchr1.config import Config, ConfigError, DataConfig  # noqa: E402
from searchr1.data import DataError, Question, load_splits, read_ids  # noqa: E402
from searchr1.datasets import build_corpus, check_disjoint, draw_ids, load_all, load_set, spec  # noqa: E402
from searchr1.datasets.readers import read_2wiki, read_musique, read_nq  # noqa: E402
from searchr1.datasets.scoring import EM, HOTPOT_F1, squad1_f1, squad2_f1  # noqa: E402
from searchr1.reward import f1 as hotpot_f1  # noqa: E402

ALL = ["hotpotqa", "2wiki", "musique", "nq"]


def by_id(questions):
    return {q.qid: q for q in questions}


# --- readers against hand-checked records -------------------------------------------------------------------

def test_2wiki_record_as_in_the_official_file():
    q = by_id(read_2wiki(ROOT / "data/2wiki/dev_context164.jsonl"))["b088d3ca08e211ebbda4ac1f6bf848b6"]
    assert q.question == "Which film whose director is younger, Forbidden Ground or Free Guy?"
    assert q.answers == ("Free Guy",) and q.type == "bridge_comparison"
    assert q.supporting_facts == (("Forbidden Ground", 0), ("Free Guy", 0), ("Pál Gábor", 0), ("Shawn Levy", 0))
    assert len(q.context) == 10 and q.context[0][0] == "Pál Gábor"
    assert q.context[0][1][0].startswith("Pál Gábor (2 November 1932 – 21 October 1987) was a Hungarian film")


def test_musique_record_with_its_alias_and_supporting_paragraphs():
    q = by_id(read_musique(ROOT / "data/musique/dev_heldout200.jsonl"))["2hop__766973_770570"]
    assert q.question == "What county is Erik Hort's birthplace a part of?"
    assert q.answers == ("Rockland County", "Rockland County, New York")  # answer, then answer_aliases
    assert q.type == "2hop" and len(q.context) == 20
    assert q.supporting_facts == (("Montebello, New York", 0), ("Erik Hort", 0))  # paragraphs idx 4 and 19
    assert dict((t, s[0]) for t, s in q.context)["Erik Hort"].startswith("Erik Hort (born February 16, 1987 in "
                                                                          "Montebello, New York)")


def test_nq_records_ids_are_their_lines_and_answers_all_count():
    qs = read_nq(ROOT / "data/nq/nq-open-oracle.jsonl.gz")
    assert len(qs) == 2655
    first, sixth = qs[0], qs[5]
    assert (first.qid, first.question, first.answers) == ("nq_0", "who got the first nobel prize in physics",
                                                          ("Wilhelm Conrad Röntgen",))
    assert first.context[0][0] == "List of Nobel laureates in Physics" and first.supporting_facts[0][1] == 0
    assert sixth.qid == "nq_5" and sixth.answers == ("Xiu Li Dai", "Dai Xiuli", "Dai Yongge", "Yongge Dai")
    assert EM("Yongge Dai", sixth.answers) == 1.0


# --- strictness: file, record and field named ---------------------------------------------------------------

def _write(tmp_path, name, records, lines=True):
    p = tmp_path / name
    p.write_text("\n".join(json.dumps(r) for r in records) if lines else json.dumps(records))
    return p


def _good_2wiki():
    return {"_id": "x1", "type": "compositional", "question": "Who?", "answer": "A",
            "context": [["T", ["s0."]]], "supporting_facts": [["T", 0]], "evidences": [["T", "r", "A"]]}


def _good_musique():
    return {"id": "2hop__1_2", "question": "Who?", "answer": "A", "answer_aliases": ["a1"], "answerable": True,
            "question_decomposition": [], "paragraphs": [{"idx": 0, "title": "T", "paragraph_text": "p",
                                                          "is_supporting": True}]}


@pytest.mark.parametrize("change,needle", [
    (lambda r: r.pop("context"), "record 1 (line 2): missing field 'context'"),  # MIGRES's demonstrations
    (lambda r: r.update(answer=3), "record 1 (line 2): field 'answer' has type int"),
    (lambda r: r.update(evidences=[["T", "r"]]), "field 'evidences' entry 0 is not [subject, relation, object]"),
    (lambda r: r.update(supporting_facts=[["U", 0]]), "field 'supporting_facts' names 'U', which is not in"),
    (lambda r: r.update(question="  "), "field 'question' is empty"),
])
def test_2wiki_reader_names_file_record_and_field(tmp_path, change, needle):
    bad = _good_2wiki() | {"_id": "x2"}
    change(bad)
    p = _write(tmp_path, "w.jsonl", [_good_2wiki(), bad])
    with pytest.raises(DataError, match=str(p).replace(".", r"\.")) as err:
        read_2wiki(p)
    assert needle in str(err.value)


@pytest.mark.parametrize("change,needle", [
    (lambda r: r.pop("answerable"), "record 1: missing field 'answerable'"),  # swarmbot's copy
    (lambda r: r.update(answerable=False), "record 1: field 'answerable' is false"),
    (lambda r: r.update(answer_aliases=[1]), "field 'answer_aliases' holds a non-string entry"),
    (lambda r: r["paragraphs"][0].pop("title"), "record 1: field 'paragraphs' entry 0: missing field 'title'"),
    (lambda r: r["paragraphs"][0].update(is_supporting=False), "marks no paragraph as supporting"),
])
def test_musique_reader_names_file_record_and_field(tmp_path, change, needle):
    bad = _good_musique() | {"id": "2hop__3_4"}
    change(bad)
    p = _write(tmp_path, "m.json", [_good_musique(), bad], lines=False)
    with pytest.raises(DataError) as err:
        read_musique(p)
    assert str(err.value).startswith(str(p)) and needle in str(err.value)


def test_musique_duplicate_ids_are_refused(tmp_path):
    p = _write(tmp_path, "m.jsonl", [_good_musique(), _good_musique()])
    with pytest.raises(DataError, match=r"record 1 \(line 2\): duplicate id '2hop__1_2' \(first at record 0\)"):
        read_musique(p)


@pytest.mark.parametrize("rec,needle", [
    ({"question": "q", "answers": [], "ctxs": [{"title": "T", "text": "x"}]}, "field 'answers' is empty"),
    ({"question": "q", "answers": ["a"], "ctxs": []}, "field 'ctxs' is empty"),
    ({"question": "q", "answers": ["a"], "ctxs": [{"title": "T"}]}, "field 'ctxs' entry 0: missing field 'text'"),
])
def test_nq_reader_names_file_record_and_field(tmp_path, rec, needle):
    good = {"question": "q0", "answers": ["a"], "ctxs": [{"title": "T", "text": "x"}]}
    p = tmp_path / "nq.jsonl.gz"
    with gzip.open(p, "wt") as f:
        f.write(json.dumps(good) + "\n" + json.dumps(rec) + "\n")
    with pytest.raises(DataError) as err:
        read_nq(p)
    assert str(err.value).startswith(f"{p}: record 1 (line 2)") and needle in str(err.value)


# --- answer scoring, as each official script ----------------------------------------------------------------

def test_normalisation_is_squad_s_for_every_set():
    golds = ["The Eiffel Tower"]
    for f1 in (HOTPOT_F1, squad1_f1, squad2_f1):
        assert EM("eiffel tower!", golds) == 1.0 and f1("eiffel tower!", golds) == 1.0
    assert EM("Wilhelm Conrad Röntgen", ["wilhelm conrad röntgen"]) == 1.0  # lower-casing is unicode's
    assert EM("Pál–Gábor", ["Pál Gábor"]) == 0.0  # only ASCII punctuation is deleted (an en dash stays)
    assert EM(None, golds) == 0.0 and squad1_f1(None, golds) == 0.0 and squad2_f1(None, golds) == 0.0


def test_yes_no_rule_is_hotpotqa_s_and_2wiki_s_only():
    assert HOTPOT_F1("yes it is", ["yes"]) == 0.0 == hotpot_f1("yes it is", ["yes"])  # 2Wiki scores as HotpotQA
    assert squad1_f1("yes it is", ["yes"]) == pytest.approx(0.5)  # NQ: precision 1/3, recall 1
    assert squad2_f1("yes it is", ["yes"]) == pytest.approx(0.5)  # MuSiQue


def test_empty_normalised_answers_score_as_squad2_only_in_musique():
    # "The" normalises to nothing: SQuAD 2.0 (MuSiQue) gives F1 1 when both sides are empty, SQuAD 1.1 (NQ) 0
    assert squad2_f1("a", ["The"]) == 1.0 and squad1_f1("a", ["The"]) == 0.0 and HOTPOT_F1("a", ["The"]) == 0.0
    assert squad2_f1("a", ["Stanley"]) == 0.0


def test_musique_aliases_and_nq_answers_count_best_of():
    golds = ("Rockland County", "Rockland County, New York")
    assert EM("Rockland County, New York", golds) == 1.0
    assert squad2_f1("Rockland County New York state", golds) == pytest.approx(2 * 0.8 * 1.0 / 1.8)
    nq = ("planner Raymond Unwin", "architect Barry Parker", "Raymond Unwin")
    assert EM("raymond unwin", nq) == 1.0 and squad1_f1("Barry Parker", nq) == pytest.approx(0.8)


# --- held-out samples, corpora, overlap -----------------------------------------------------------------------

@pytest.mark.parametrize("name,n", [("2wiki", 164), ("nq", 200)])
def test_heldout_ids_follow_the_seeded_rule(name, n):
    ds = spec(name)
    ids = read_ids(ROOT / ds.ids_file)
    assert len(ids) == len(set(ids)) == n
    assert ids == draw_ids([q.qid for q in ds.read(ROOT / ds.file)], 200, 0)


def test_musique_file_holds_exactly_its_heldout_sample_in_order():
    ds = spec("musique")
    assert [q.qid for q in ds.read(ROOT / ds.file)] == read_ids(ROOT / ds.ids_file)


def test_corpora_keep_every_supporting_paragraph():
    for name in ("2wiki", "musique", "nq"):
        s = load_set(spec(name), ROOT, 200)
        passages = {(p["title"], p["text"]) for p in s.corpus}
        assert len(passages) == len(s.corpus)
        for q in s.questions:
            text = dict((t, "".join(sents).strip()) for t, sents in q.context)
            assert all((t, text[t]) in passages for t, _ in q.supporting_facts), (name, q.qid)
    # a title key would not: MuSiQue's questions hold different paragraphs of the same article
    mus = load_set(spec("musique"), ROOT, 200)
    assert len({p["title"] for p in mus.corpus}) < len(mus.corpus)
    assert len(load_set(spec("nq"), ROOT, 200).corpus) == len(build_corpus(read_nq(ROOT / spec("nq").file)))


def test_load_all_loads_every_set_disjoint_from_training():
    splits = load_all(DataConfig(eval_sets=ALL), ROOT)
    assert list(splits.eval_sets) == ["2wiki", "musique", "nq"]
    assert [len(s.questions) for s in splits.eval_sets.values()] == [164, 200, 200]
    assert len(splits.heldout) == 200 and splits.corpus == load_splits(DataConfig(), ROOT).corpus
    small = load_all(DataConfig(eval_sets=ALL, eval_size=4), ROOT)
    assert [len(s.questions) for s in small.eval_sets.values()] == [4, 4, 4]
    assert load_all(DataConfig(), ROOT).eval_sets == {}


def test_a_heldout_question_that_is_a_training_question_is_refused():
    held = read_2wiki(ROOT / "data/2wiki/dev_context164.jsonl")[:3]
    same_id = Question(held[1].qid, "another question", ("x",), "", "", (), ())
    with pytest.raises(DataError, match=f"2wiki held-out id '{held[1].qid}' is a training question"):
        check_disjoint("2wiki", held, [same_id])
    same_text = Question("other", held[2].question.upper() + "?", ("x",), "", "", (), ())
    with pytest.raises(DataError, match=f"2wiki held-out question '{held[2].qid}' is training question 'other'"):
        check_disjoint("2wiki", held, [same_text])
    check_disjoint("2wiki", held, load_splits(DataConfig(), ROOT).train)


def test_missing_ids_are_named(tmp_path):
    ds = spec("2wiki")
    (tmp_path / "data/2wiki").mkdir(parents=True)
    (tmp_path / ds.file).write_bytes((ROOT / ds.file).read_bytes())
    (tmp_path / ds.ids_file).write_text("nope\n")
    with pytest.raises(DataError, match=r"heldout\.ids: 1 ids are not in data/2wiki/dev_context164\.jsonl, e\.g\. 'nope'"):
        load_set(ds, tmp_path, 200)


# --- config ---------------------------------------------------------------------------------------------------

def test_eval_sets_config_key():
    assert DataConfig().eval_sets == ["hotpotqa"]
    cfg = launch.compose_config(["+experiment=smoke", "data.eval_sets=[hotpotqa,2wiki,musique,nq]"])
    assert cfg.data.eval_sets == ALL
    for bad, needle in ((["hotpotqa", "trivia"], "data.eval_sets='trivia': must be one of"),
                        (["2wiki"], "must start with hotpotqa"), (["hotpotqa", "nq", "nq"], "name each set once")):
        with pytest.raises(ConfigError, match=needle):
            DataConfig(eval_sets=bad)
    with pytest.raises(ConfigError, match="data.eval_on"):
        DataConfig(eval_sets=["hotpotqa", "nq"], dev_size=10, eval_on="dev")
    with pytest.raises(SystemExit, match="elastic rollouts evaluate hotpotqa only"):
        launch.compose_config(["+experiment=smoke", "cluster.elastic.enabled=true", "data.eval_sets=[hotpotqa,nq]"])


# --- end to end -----------------------------------------------------------------------------------------------

def test_a_smoke_run_evaluates_each_set_with_its_own_line_file_and_paired_test(smoke_run):
    """The shared smoke run (`data.eval_sets=[hotpotqa,2wiki]`, 3 steps): at both evaluation points (versions 0
    and 3) the rollout ranks evaluate 2wiki's first 4 held-out questions beside HotpotQA's; trainer 0 writes its
    own metrics line and prediction file per set and evaluation, and the console gets each set's paired test."""
    from searchr1 import metrics as K
    from searchr1.metrics import read_metrics

    r, run = smoke_run
    recs = read_metrics(run / "metrics.jsonl")
    hotpot = [x for x in recs if x[K.KIND] == K.EVAL]
    wiki = [x for x in recs if x[K.KIND] == K.EVAL_SET]
    assert [x[K.STEP] for x in hotpot] == [0, 3] and [x[K.STEP] for x in wiki] == [0, 3]
    assert all(x[K.DATASET] == "2wiki" and x[K.EVAL_N] == 4 and 0 <= x[K.EVAL_F1] <= 1 for x in wiki)
    first4 = read_ids(ROOT / "data/2wiki/heldout.ids")[:4]
    for v in (0, 3):
        preds = [json.loads(line) for line in (run / "predictions" / "2wiki" / f"step_{v:06d}.jsonl").open()]
        assert sorted(p["id"] for p in preds) == sorted(first4)
        assert (run / "predictions" / f"step_{v:06d}.jsonl").is_file()  # HotpotQA's, where it always was
    assert "2wiki held-out EM at version 0: " in r.stdout and "2wiki held-out EM at version 3: " in r.stdout
    assert "held-out EM before (step 0)" in r.stdout and "2wiki held-out EM before (step 0)" in r.stdout
    assert r.stdout.count("exact McNemar p = ") == 2
    data = json.loads((run / "data.json").read_text())
    assert data["eval_sets"]["2wiki"]["heldout_ids"] == first4 and data["eval_sets"]["2wiki"]["corpus_passages"] > 0
    assert [x[K.STEP] for x in json.loads((run / "summary.json").read_text())["eval_sets"]["2wiki"]] == [0, 3]


# --- training sets beside HotpotQA (data.train_mix) ----------------------------------------------------------

def test_mix_counts_round_by_largest_remainder_and_each_set_draws_its_own_stream():
    from searchr1.data import mix_counts, mixed_step_questions, step_questions

    assert mix_counts(4, (0.5, 0.5)) == [2, 2] and mix_counts(5, (0.5, 0.5)) == [3, 2]
    assert mix_counts(4, (0.7, 0.3)) == [3, 1] and mix_counts(3, (0.2, 0.4, 0.4)) == [1, 1, 1]
    idx = mixed_step_questions((10, 30), (0.5, 0.5), step=3, per_step=4, seed=1)
    assert idx[:2] == step_questions(10, 3, 2, 1) and all(10 <= i < 40 for i in idx[2:])
    assert [i - 10 for i in idx[2:]] == step_questions(30, 3, 2, 1 + 104_729)
    with pytest.raises(ValueError, match="no question"):
        mixed_step_questions((10, 0), (0.5, 0.5), 0, 4, 1)


def test_nq_joins_the_training_pool_and_index_outside_its_heldout_sample():
    from searchr1.schedule import make_schedule

    cfg = launch.compose_config(["+experiment=smoke", "+data.train_mix.nq=0.5", "algo.questions_per_step=4",
                                 "data.eval_sets=[hotpotqa,nq]", "data.eval_size=200"])
    plain = load_splits(DataConfig(eval_size=200), ROOT)
    s = load_all(cfg.data, ROOT)
    nq = [q for q in s.train if q.dataset == "nq"]
    held = read_ids(ROOT / "data/nq/heldout.ids")
    assert s.train[: len(plain.train)] == plain.train and s.train[len(plain.train):] == nq
    assert len(nq) >= 2655 - 200 - 20 and not {q.qid for q in nq} & set(held)
    held_texts = {q.question.lower() for q in s.eval_sets["nq"].questions}
    assert not [q for q in nq if q.question.lower() in held_texts]
    assert len(s.corpus) > len(plain.corpus) and s.corpus[: len(plain.corpus)] == plain.corpus
    assert s.sizes("rl") == (len(plain.train), len(nq)) and load_splits(cfg.data, ROOT).sizes("rl") == len(plain.train)
    units = make_schedule(cfg).units(cfg.warm_start.steps, 2, s.sizes("rl"))
    picked = [s.train[i] for u in units for i in u.questions]
    assert [q.dataset for q in picked] == ["hotpotqa", "hotpotqa", "nq", "nq"]


@pytest.mark.parametrize("mix, needle", [(["+data.train_mix.hotpotqa=0.5"], "data.train_mix='hotpotqa'"),
                                         (["+data.train_mix.nq=1.0"], "data.train_mix.nq=1.0"),
                                         (["+data.train_mix.nq=0.6", "+data.train_mix.musique=0.5"],
                                          "leave HotpotQA a part")])
def test_a_bad_training_mix_is_named(mix, needle):
    with pytest.raises(SystemExit, match=needle.replace(".", r"\.")):
        launch.compose_config(["+experiment=smoke", *mix])
