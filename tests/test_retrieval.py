import dataclasses
import logging
import os
import threading

import numpy as np
import pytest
from rank_bm25 import BM25Okapi

from searchr1 import retrieval as C  # the cache's save_index / load_index / load_or_build
from searchr1 import retrieval as R
from searchr1.retrieval import bm25 as B
from searchr1.retrieval import bm25_scores as bm25
from searchr1.retrieval import bm25_topk
from searchr1.config import BM25Config, DataConfig, ModelConfig, RetrieverConfig
from searchr1.data import load_splits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = [
    {"title": "Paris", "text": "Paris is the capital and largest city of France."},
    {"title": "Berlin", "text": "Berlin is the capital of Germany. The city is large."},
    {"title": "Cats", "text": "The cat is a small domesticated animal; a cat sleeps a lot."},
    {"title": "Cats", "text": "The cat is a small domesticated animal; a cat sleeps a lot."},
    {"title": "Beyoncé", "text": "Beyoncé Knowles is an American singer from Houston."},
]


def cfg_for(backend, **kw):
    return RetrieverConfig(name=backend, bm25=BM25Config(threads=1, **kw))


@pytest.fixture(scope="module")
def real():
    splits = load_splits(DataConfig(), root=ROOT)
    passages = splits.corpus[:400]
    queries = [q.question for q in splits.train[:60]]
    return passages, queries


def test_tokenize_lowercases_splits_on_non_alphanumerics_and_keeps_accents():
    assert B.tokenize("Beyoncé's 2nd-album, snake_case  NAME!") == ["beyoncé", "s", "2nd", "album", "snake", "case",
                                                                    "name"]
    assert B.tokenize("   \n\t ") == []
    assert B.tokenize("The cat and the hat", stopwords="en") == ["cat", "hat"]
    with pytest.raises(ValueError, match="retriever.stopwords='fr'"):
        B.tokenize("x", stopwords="fr")
    assert B.tokenizer_signature("none") != B.tokenizer_signature("en")


@pytest.mark.parametrize("backend", ["rank_bm25", "bm25s"])
def test_scores_are_rank_bm25_okapi_scores(real, backend):
    passages, queries = real
    okapi = BM25Okapi([B.tokenize(p["title"] + "\n" + p["text"]) for p in passages], k1=1.5, b=0.75, epsilon=0.25)
    hits = R.build_index(passages, cfg_for(backend)).search(queries)
    for q, h in zip(queries, hits):
        scores = okapi.get_scores(B.tokenize(q))
        want = np.lexsort((np.arange(len(scores)), -scores))[:3]
        assert [p.pid for p in h] == list(want), q
        assert [p.score for p in h] == [scores[i] for i in want], q  # bit for bit, not approximately


def test_ties_break_by_passage_id_in_both_backends():
    for backend in ("rank_bm25", "bm25s"):
        hits = R.build_index(SMALL, cfg_for(backend)).search(["cat sleeps", "capital"], k=2)
        assert [p.pid for p in hits[0]] == [2, 3] and hits[0][0].score == hits[0][1].score
        assert [p.title for p in hits[1]] == ["Paris", "Berlin"] or [p.title for p in hits[1]] == ["Berlin", "Paris"]
        assert hits[1][0].score > hits[1][1].score  # Paris' passage is shorter: distinct scores, no tie


@pytest.mark.parametrize("backend", ["rank_bm25", "bm25s"])
def test_empty_unknown_and_huge_queries(backend):
    index = R.build_index(SMALL, cfg_for(backend, max_query_words=5))
    huge = "capital of france " + " ".join(["zebra"] * 5000)
    hits = index.search(["", "   \t", "qwertyuiop", huge, "capital of france"])
    assert hits[:3] == [[], [], []]
    assert hits[3] == hits[4]  # cut to its first 5 words (zebras beyond the cut cannot count)
    assert hits[4][0].title == "Paris"
    assert index.search([]) == []
    assert len(index.search(["cat"], k=50)[0]) == 2  # k beyond the corpus: every passage that matches
    with pytest.raises(TypeError, match="list of strings"):
        index.search("capital of france")
    with pytest.raises(ValueError, match="k=0"):
        index.search(["cat"], k=0)
    assert index.searched_queries == 6 and index.search_seconds > 0


def test_bad_passages_are_named():
    with pytest.raises(ValueError, match=r"passages\[1\]: field 'text'"):
        R.build_index([{"title": "a", "text": "b"}, {"title": "c"}], cfg_for("bm25s"))
    with pytest.raises(ValueError, match="non-empty list"):
        R.build_index([], cfg_for("bm25s"))


@pytest.mark.parametrize("backend", ["rank_bm25", "bm25s"])
def test_cache_round_trip_loads_memory_mapped(tmp_path, real, backend):
    passages, queries = real
    cfg = cfg_for(backend)
    built = C.load_or_build(passages, cfg, str(tmp_path))
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    manifest = (folder / "manifest.json").read_text()
    assert '"stopwords": "none"' in manifest and B.TOKENIZER_NAME in manifest  # the tokenizer is recorded
    again = C.load_or_build(passages, cfg, str(tmp_path))
    assert [p for p in tmp_path.iterdir() if p.is_dir()] == [folder]
    if backend == "bm25s":
        assert isinstance(again.bm.scores["data"], np.memmap)
    assert again.search(queries) == built.search(queries)


def test_corrupt_cache_is_rebuilt_never_served(tmp_path, real, caplog):
    passages, queries = real
    cfg = cfg_for("bm25s")
    good = C.load_or_build(passages, cfg, str(tmp_path)).search(queries)
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    data = folder / "data.csc.index.npy"
    raw = bytearray(data.read_bytes())
    raw[-5] ^= 0xFF  # one flipped bit pattern deep in the scores: same size, wrong content
    data.write_bytes(bytes(raw))
    with pytest.raises(R.IndexCorrupt, match="damaged"):
        C.load_index(str(folder), passages, cfg)
    with caplog.at_level(logging.WARNING, logger="searchr1.retrieval"):
        assert C.load_or_build(passages, cfg, str(tmp_path)).search(queries) == good
    assert "rebuilding" in caplog.text
    (folder / "idf.npy").unlink()
    with pytest.raises(R.IndexCorrupt, match="differ from the manifest's list"):
        C.load_index(str(folder), passages, cfg)
    (folder / "manifest.json").write_text("{not json")
    with pytest.raises(R.IndexCorrupt, match="unreadable"):
        C.load_index(str(folder), passages, cfg)
    assert C.load_or_build(passages, cfg, str(tmp_path)).search(queries) == good
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folders left


def test_cache_for_other_corpus_or_settings_is_not_served(tmp_path):
    cfg = cfg_for("bm25s")
    C.save_index(R.build_index(SMALL, cfg), str(tmp_path / "ix"))
    with pytest.raises(R.IndexCorrupt, match="corpus_sha256"):
        C.load_index(str(tmp_path / "ix"), SMALL[:-1] + [{"title": "x", "text": "y"}], cfg)
    with pytest.raises(R.IndexCorrupt, match="settings"):
        C.load_index(str(tmp_path / "ix"), SMALL, dataclasses.replace(cfg, bm25=dataclasses.replace(cfg.bm25, k1=1.2)))
    with pytest.raises(R.IndexCorrupt, match="settings"):
        C.load_index(str(tmp_path / "ix"), SMALL, dataclasses.replace(cfg, bm25=dataclasses.replace(cfg.bm25, stopwords="en")))


def test_concurrent_callers_share_one_build(tmp_path, real):
    passages, queries = real
    cfg = cfg_for("bm25s")
    results, errors = [], []

    def rank():
        try:
            results.append(C.load_or_build(passages, cfg, str(tmp_path)).search(queries[:5]))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=rank) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 3 and results[0] == results[1] == results[2]
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 1


def test_two_threads_of_bm25s_give_the_one_thread_answer(real):
    passages, queries = real
    queries = queries + ["", "zzqx"] + queries[::-1]  # 122: pipelined in slices, empty and unknown among them
    one = R.build_index(passages, cfg_for("bm25s")).search(queries)
    two = R.build_index(passages, RetrieverConfig(name="bm25s", bm25=BM25Config(threads=2))).search(queries)
    assert one == two and one[60] == one[61] == [] and one[62] == one[59]
    assert len(queries) >= B.PIPELINE * 2 * 8  # enough queries to be cut in slices


@pytest.fixture(scope="module")
def tokenizer():
    from searchr1.models import load_tokenizer

    return load_tokenizer(ModelConfig(name="tiny", source="tiny"))


def test_format_passages_search_r1_style_with_policy_token_budget(tokenizer):
    long_text = " ".join(f"word{i}" for i in range(300))
    hits = [R.Passage(0, "Paris", "Paris is the capital of France.", 3.0), R.Passage(7, "Long", long_text, 1.0)]
    text = R.format_passages(hits, tokenizer, max_tokens=20)
    first, second = text.split("\n")
    assert first == "Doc 1(Title: Paris) Paris is the capital of France."
    assert second.startswith("Doc 2(Title: Long) word0 word1")
    body = second[len("Doc 2(Title: Long) "):]
    assert len(tokenizer(body, add_special_tokens=False)["input_ids"]) <= 20 and long_text.startswith(body)
    assert R.format_passages([], tokenizer, 20) == R.NO_RESULTS
    accented = R.Passage(1, "B", "Beyoncé Knowles", 1.0)
    cut = R.format_passages([accented], tokenizer, max_tokens=3)
    assert "\ufffd" not in cut and cut.startswith("Doc 1(Title: B) Beyon")
    with pytest.raises(ValueError, match="max_tokens=0"):
        R.format_passages(hits, tokenizer, 0)


def test_okapi_idf_floors_negative_idf_at_epsilon_times_mean():
    # 4 passages; df 1 -> log(3.5/1.5); df 3 -> log(1.5/3.5) < 0 -> floored to 0.25 * mean of the raw idfs
    raw = [np.log(3.5 / 1.5), np.log(1.5 / 3.5)]
    idf_v = bm25.okapi_idf(np.array([1, 3]), 4, 0.25)
    assert np.allclose(idf_v, [raw[0], 0.25 * (raw[0] + raw[1]) / 2])


def _kernel_index(passages, cfg):
    """The arrays top_k_exact takes, from a built bm25s index."""
    ix = R.build_index(passages, cfg)
    sc = ix.bm.scores
    return ix, (sc["indptr"], sc["indices"], sc["data"], bm25.max_impacts(sc["indptr"], sc["data"]), ix.tf_z,
                ix.len_d, ix.idf_v, cfg.bm25.k1, cfg.bm25.b, ix.avgdl)


def test_term_doc_counts_and_top_k_exact_break_ties_by_passage():
    vocab, tok_n, len_d = bm25.count_tokens([["a", "b", "a"], ["b"], ["a"], []], 4)
    assert vocab == {"a": 0, "b": 1} and list(len_d) == [3, 1, 1, 0]
    term_z, doc_z, tf_z, indptr_v = bm25.term_doc_counts(tok_n, len_d, len(vocab))
    assert list(zip(term_z, doc_z, tf_z)) == [(0, 0, 2), (0, 2, 1), (1, 0, 1), (1, 1, 1)]
    assert list(indptr_v) == [0, 2, 4]
    ix, arrays = _kernel_index(SMALL, cfg_for("bm25s"))
    cat, sleeps = ix.vocab["cat"], ix.vocab["sleeps"]
    q_ptr, q_ids = np.array([0, 2, 3]), np.array([cat, sleeps, -1])  # -1: a word the index does not know
    for k in (1, 2, 3, 5):
        pid_qk, score_qk = bm25_topk.top_k_exact(q_ptr, q_ids, *arrays, k, 0)
        assert pid_qk[0, :2].tolist() == [2, 3][:k] and score_qk[0, 0] == score_qk[0, min(k, 2) - 1]  # a tie
        assert (pid_qk[0, 2:] == -1).all() and (pid_qk[1] == -1).all()  # only passages that share a word


@pytest.fixture(scope="module")
def shipped():
    return load_splits(DataConfig(), root=ROOT).corpus


def _odd_queries(passages) -> list[str]:
    """Queries of the shapes retrieval gets wrong most easily: repeated words, stop words only, one common word,
    unknown words among known ones, numbers, accents, and queries at the max_query_words cut."""
    g = np.random.default_rng(0)
    words = [w for p in passages[:300] for w in B.tokenize(p["text"])]
    out = ["the the the", "of", "in the", "what is the", "1 2 3 2019", "Beyoncé Beyonce", "zzqx the",
           "the " * 40 + "paris", "who who who was was the first"]
    for _ in range(40):
        n = int(g.integers(1, 70))
        out.append(" ".join(words[int(i)] for i in g.integers(0, len(words), n)))
    return out


@pytest.fixture(scope="module")
def okapi_case(shipped):
    """2,500 shipped passages, odd and title queries, and rank_bm25's scores of every passage for each."""
    passages = shipped[:2500]
    cfg = cfg_for("bm25s")
    okapi = BM25Okapi([B.tokenize(p["title"] + "\n" + p["text"]) for p in passages], k1=1.5, b=0.75, epsilon=0.25)
    queries = _odd_queries(passages) + [p["title"] for p in passages[::97]]
    toks = [B.tokenize(q)[:cfg.bm25.max_query_words] for q in queries]
    scores = [okapi.get_scores(t) if t else np.zeros(len(passages)) for t in toks]
    return passages, cfg, queries, toks, scores


@pytest.mark.parametrize("check_len", [1, 10**9])  # a checkpoint before every list / never: pruning on, off
@pytest.mark.parametrize("probes", [1, 64])  # theta from the k-th of k probes, or of 64: a bound, never the answer
def test_top_k_exact_is_rank_bm25_with_and_without_pruning(okapi_case, check_len, probes):
    passages, cfg, queries, toks, scores = okapi_case
    ix, arrays = _kernel_index(passages, cfg)
    ids = [[ix.vocab.get(w, -1) for w in t] for t in toks]
    q_ptr = np.cumsum([0] + [len(x) for x in ids])
    q_ids = np.array([t for x in ids for t in x] or [0])
    ws = bm25_topk.Workspace()  # one scratch for every call, as a rollout's thread keeps it
    for k in (1, 3, 7, 1000):
        pid_qk, score_qk = bm25_topk.top_k_exact(q_ptr, q_ids, *arrays, k, 0, check_len, 8, 4, ws=ws, probes=probes)
        for i, sc in enumerate(scores):
            want = [int(j) for j in np.lexsort((np.arange(len(sc)), -sc))[:k] if sc[j] > 0]
            got = [int(p) for p in pid_qk[i] if p >= 0]
            assert got == want, queries[i]
            assert score_qk[i, :len(got)].tolist() == [sc[j] for j in want], queries[i]  # bit for bit
            if k == 3:  # the same query alone, after every other query has dirtied and cleaned the scratch
                one = bm25_topk.top_k_exact(q_ptr[i:i + 2] - q_ptr[i], q_ids[q_ptr[i]:q_ptr[i + 1]], *arrays, k, 0,
                                            check_len, 8, 4, ws=ws, probes=probes)
                assert one[0][0].tolist() == pid_qk[i].tolist() and one[1][0].tolist() == score_qk[i].tolist()
        assert not ws.acc.any()
