"""Dense and hybrid retrieval: exact order against a brute-force inner product, the fusion by hand, the cache's
refusals by name, a damaged cache rebuilt, a missing encoder named."""
import dataclasses
import json
import logging

import numpy as np
import pytest

from searchr1 import retrieval as R
from searchr1.config import RetrieverConfig
from searchr1.data import DataConfig, load_splits
from searchr1.retrieval import hybrid
from searchr1.retrieval.schema import DenseConfig, HybridConfig

QUERIES = ["Who directed the film?", "capital city of the country", "American football player", "",
           "Which band released the album first?"]


@pytest.fixture(scope="module")
def passages():
    return load_splits(DataConfig()).corpus[:60]  # real HotpotQA paragraphs, few enough to encode in seconds


def dense_cfg(**dense) -> RetrieverConfig:
    return RetrieverConfig(name="dense", top_k=5, dense=DenseConfig(**{"max_length": 64, **dense}))


@pytest.fixture(scope="module")
def dense_index(passages):
    return R.build_index(passages, dense_cfg())


def brute_force(emb_nd, q_d, k):
    score_n = emb_nd.astype(np.float64) @ q_d.astype(np.float64)
    order = np.lexsort((np.arange(len(score_n)), -score_n))[:k]
    return [(int(i), float(score_n[i])) for i in order]


def test_dense_hits_are_the_brute_force_inner_product_ids_scores_and_order(dense_index):
    q_qd = dense_index.embed_queries([q for q in QUERIES if q])
    hits = dense_index.search(QUERIES, k=7)
    assert hits[3] == []  # an empty query gets nothing, as BM25's does
    live = [h for q, h in zip(QUERIES, hits) if q]
    for row, h in enumerate(live):
        assert [(p.pid, p.score) for p in h] == brute_force(dense_index.emb_nd, q_qd[row], 7)
    norms = np.linalg.norm(dense_index.emb_nd, axis=1)
    assert np.allclose(norms, 1, atol=1e-5)  # normalize=True: the inner product is the cosine


def test_hnsw_finds_what_flat_finds_on_a_small_corpus(passages, dense_index):
    approx = R.build_index(passages, dense_cfg(index="hnsw"))
    assert approx.search(QUERIES, k=5) == dense_index.search(QUERIES, k=5)


def test_reciprocal_rank_fusion_by_hand():
    bm25 = [(4, 12.0), (1, 7.5), (9, 1.0)]
    dense = [(1, 0.9), (7, 0.8), (4, 0.1)]
    fused = hybrid.rrf([bm25, dense], rrf_k=60)
    assert fused == pytest.approx({4: 1 / 61 + 1 / 63, 1: 1 / 62 + 1 / 61, 9: 1 / 63, 7: 1 / 62})
    # second in BM25 and first in dense (1) beats first and third (4); one list each: second (7) beats third (9)
    ranked = R.base.rank(np.array(list(fused)), np.array(list(fused.values())), 4, positive_only=False)
    assert [pid for pid, _ in ranked] == [1, 4, 7, 9]
    tie = hybrid.rrf([[(5, 1.0)], [(2, 1.0)]], rrf_k=60)  # each first in one part: equal, the lower id first
    assert [pid for pid, _ in R.base.rank(np.array(list(tie)), np.array(list(tie.values())), 2, False)] == [2, 5]


def test_weighted_fusion_by_hand():
    bm25 = [(3, 10.0), (8, 6.0), (2, 2.0)]  # normalised: 1, 0.5, 0
    dense = [(8, 0.7), (5, 0.5)]  # normalised: 1, 0
    fused = hybrid.weighted([bm25, dense], [0.25, 0.75])
    assert fused == pytest.approx({3: 0.25, 8: 0.25 * 0.5 + 0.75, 2: 0.0, 5: 0.0})
    assert hybrid.weighted([[(1, 2.0), (4, 2.0)]], [1.0]) == {1: 1.0, 4: 1.0}  # equal scores: all count 1


def test_hybrid_index_fuses_its_parts_as_the_pure_function_does(passages, tmp_path):
    cfg = dataclasses.replace(dense_cfg(), name="hybrid", cache_dir=str(tmp_path), hybrid=HybridConfig(depth=10))
    ix = R.load_or_build(passages, cfg)
    sparse, dense = ix.parts
    assert (sparse.backend, dense.backend) == ("bm25s", "dense")
    for q, got in zip(QUERIES, ix.search(QUERIES, k=4)):
        parts = [p.top_k_text([q], 10)[0] for p in ix.parts]
        fused = hybrid.rrf(parts, 60)
        want = R.base.rank(np.array(list(fused), dtype=np.int64), np.array(list(fused.values())), 4, False) if fused else []
        assert [(p.pid, p.score) for p in got] == want
    assert sorted(d.name.split("-")[0] for d in tmp_path.iterdir() if d.is_dir()) == ["bm25s", "dense"]  # shared


def test_the_cache_refuses_another_encoder_prefix_or_corpus_by_name(passages, dense_index, tmp_path):
    R.save_index(dense_index, str(tmp_path / "ix"))
    with pytest.raises(R.IndexCorrupt, match="passage_prefix='', need 'passage: '"):
        R.load_index(str(tmp_path / "ix"), passages, dense_cfg(passage_prefix="passage: "))
    with pytest.raises(R.IndexCorrupt, match="corpus_sha256"):
        R.load_index(str(tmp_path / "ix"), passages[:-1] + [{"title": "x", "text": "y"}], dense_cfg())
    other = tmp_path / "other-encoder"  # another encoder's files: refused before a weight is read
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 384}))
    (other / "model.safetensors").write_bytes(b"not the same weights")
    with pytest.raises(R.IndexCorrupt, match=r"settings\.encoder\.weights"):
        R.load_index(str(tmp_path / "ix"), passages, dense_cfg(encoder=str(other)))


def test_a_damaged_dense_cache_is_rebuilt_not_served(passages, dense_index, tmp_path, caplog):
    cfg = dataclasses.replace(dense_cfg(), cache_dir=str(tmp_path))
    good = R.load_or_build(passages, cfg).search(QUERIES)
    (folder,) = [d for d in tmp_path.iterdir() if d.is_dir()]
    emb = folder / "embeddings.npy"
    data = bytearray(emb.read_bytes())
    data[-5] ^= 0xFF  # one flipped byte in an embedding
    emb.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="searchr1.retrieval"):
        again = R.load_or_build(passages, cfg)
    assert "damaged" in caplog.text and str(emb) in caplog.text
    assert again.search(QUERIES) == good == dense_index.search(QUERIES)


def test_a_missing_encoder_is_named(passages, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"retriever\.dense\.encoder='no-such-encoder-pkg'.*nothing downloads"):
        R.build_index(passages, dense_cfg(encoder="no-such-encoder-pkg"))
    with pytest.raises(FileNotFoundError, match=r"retriever\.dense\.encoder: .* holds no"):
        R.build_index(passages, dense_cfg(encoder=str(tmp_path)))


@pytest.mark.slow
def test_a_smoke_run_retrieves_with_the_dense_index_end_to_end(tmp_path):
    """The roles with retriever=dense on shipped HotpotQA: prepare builds the index, the rollout ranks load it, and
    the warm start's scripted searches go through it. The corpus is that of 24 training questions and the 4 held-out
    ones (272 passages, cut at 32 tokens): encoding all 6,880 shipped passages took 3 minutes of an AVX2 core and
    checks nothing more."""
    import subprocess
    import sys
    from pathlib import Path

    from searchr1 import metrics as K
    from searchr1.metrics import read_metrics

    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "launch.py", "+experiment=smoke", f"run_root={tmp_path}", "retriever=dense",
                        "retriever.dense.max_length=32", "steps=1", "warm_start.steps=1",
                        "warm_start.questions_per_step=2", "data.train_size=24"],
                       cwd=root, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    for rank in (2, 3):
        assert "dense index of" in (run / "logs" / f"rank{rank}.log").read_text()
    warm = [x for x in read_metrics(run / "metrics.jsonl") if x[K.KIND] == K.TRAIN][0]
    assert warm["rollout/searches"] == 1.0 and warm["rollout/info_tokens"] > 0 and warm["rollout/retrieval_s"] > 0
