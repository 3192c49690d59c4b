"""HotpotQA loading in both real formats, validation errors that name file/record/field, splits, corpus."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from searchr1.config import DataConfig
from searchr1.data import DataError, build_corpus, load_file, load_splits, read_ids, step_questions

ROOT = Path(__file__).resolve().parent.parent
D = ROOT / "data" / "hotpotqa"
OFFICIAL = D / "dev_distractor" / "official_dev_first103.json"
HF_FILES = [D / "dev_distractor" / "rpt_train300.jsonl", D / "dev_distractor" / "rpt_test500.jsonl"]


def test_both_formats_give_the_same_records():
    official = {q.qid: q for q in load_file(OFFICIAL)}
    hf = {q.qid: q for f in HF_FILES for q in load_file(f)}
    shared = set(official) & set(hf)
    assert len(shared) == 12  # 6 ids with rpt_train300, 6 with rpt_test500 (data/hotpotqa/SOURCES.md)
    for qid in shared:
        assert official[qid] == hf[qid]


def test_known_records():
    q = load_file(OFFICIAL)[0]
    assert q.qid == "5a8b57f25542995d1e6f1371" and q.answers == ("yes",) and q.type == "comparison"
    assert q.supporting_facts == (("Scott Derrickson", 0), ("Ed Wood", 0))
    amor = load_file(D / "train" / "amor_train_hard100.json")  # JSON lines, AMOR's supporting-fact variant
    assert len(amor) == 100 and all(isinstance(i, int) for _, i in amor[0].supporting_facts)
    hf_list = load_file(D / "train" / "hf_train_first10.json")  # HF records in a JSON list
    assert hf_list[0].answers == ("Arthur's Magazine",)


def test_splits_are_disjoint_and_fixed():
    s = load_splits(DataConfig(), ROOT)
    assert len(s.train) == 500 and len(s.heldout) == 200
    assert not {q.qid for q in s.train} & {q.qid for q in s.heldout}
    assert [q.qid for q in s.heldout] == read_ids(D / "heldout200.ids")
    titles = [p["title"] for p in s.corpus]
    assert len(titles) == len(set(titles))
    narrow = load_splits(DataConfig(corpus_scope="train"), ROOT)
    assert len(narrow.corpus) < len(s.corpus)
    gold = {t for q in s.heldout for t, _ in q.supporting_facts}
    assert gold <= set(titles)  # train+eval scope: every held-out question is answerable from the index


def test_corpus_is_deduplicated_by_title():
    qs = load_file(OFFICIAL)
    corpus = build_corpus(qs + qs)
    assert len(corpus) == len({t for q in qs for t, _ in q.context})
    assert corpus[0]["text"] and not corpus[0]["text"].startswith(" ")


@pytest.mark.parametrize("mutate,needle", [
    (lambda r: r.pop("answer"), "missing field 'answer'"),
    (lambda r: r.update(context=[["t", "not a list"]]), "field 'context' paragraph 0"),
    (lambda r: r.update(question="  "), "field 'question' is empty"),
    (lambda r: r.update(supporting_facts=[["t", "x"]]), "field 'supporting_facts'"),
])
def test_malformed_record_is_named(tmp_path, mutate, needle):
    recs = json.loads(OFFICIAL.read_text())[:3]
    mutate(recs[2])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(recs))
    with pytest.raises(DataError, match="record 2") as err:
        load_file(bad)
    assert str(bad) in str(err.value) and needle in str(err.value)


def test_truncated_jsonl_names_the_line(tmp_path):
    lines = HF_FILES[0].read_text().splitlines()[:3]
    bad = tmp_path / "trunc.jsonl"
    bad.write_text("\n".join(lines[:2] + [lines[2][:200]]))
    with pytest.raises(DataError, match=r"record 2 \(line 3\)"):
        load_file(bad)


def test_duplicate_ids_are_an_error(tmp_path):
    recs = json.loads(OFFICIAL.read_text())[:2]
    bad = tmp_path / "dup.json"
    bad.write_text(json.dumps(recs + recs[:1]))
    with pytest.raises(DataError, match="duplicate id"):
        load_file(bad)


def test_stats_cli(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "searchr1.data", "stats", str(OFFICIAL), str(HF_FILES[0])],
                        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0
    first = json.loads(ok.stdout.splitlines()[0])
    assert first["questions"] == 103 and first["types"] == {"comparison": 21, "bridge": 82}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(HF_FILES[0].read_text().splitlines()[0][:300] + "\n")
    r = subprocess.run([sys.executable, "-m", "searchr1.data", "stats", str(bad)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and str(bad) in r.stderr and "record 0" in r.stderr


def test_step_questions_cover_the_pool_per_epoch_and_are_reproducible():
    n, per = 10, 5
    first_epoch = step_questions(n, 0, per, 0) + step_questions(n, 1, per, 0)
    assert sorted(first_epoch) == list(range(n))
    assert step_questions(n, 7, per, 0) == step_questions(n, 7, per, 0)
    assert step_questions(n, 0, per, 1) != step_questions(n, 0, per, 0)


def test_a_dev_split_for_tuning_comes_out_of_the_training_pool():
    full = load_splits(DataConfig(), ROOT)
    a = load_splits(DataConfig(dev_size=100, eval_on="dev"), ROOT)
    b = load_splits(DataConfig(dev_size=100, eval_on="dev"), ROOT)
    assert [q.qid for q in a.dev] == [q.qid for q in b.dev] and len(a.dev) == 100 and len(a.train) == 400
    assert not {q.qid for q in a.dev} & {q.qid for q in a.train}
    assert {q.qid for q in a.dev} | {q.qid for q in a.train} == {q.qid for q in full.train}
    assert a.evaluation == a.dev and full.evaluation == full.heldout and a.corpus == full.corpus
    with pytest.raises(DataError, match="data.dev_size=500"):
        load_splits(DataConfig(dev_size=500), ROOT)
