"""The engines of bench/retrieval.py's single-query section: this project's index and its peers, each behind one
call, `search(query, k, threads) -> [(passage id, score), ...]` (best first), that takes the query's text and
tokenizes it with this project's tokenizer inside the call, so that every engine indexes and is asked the very
same words and pays for the same tokenizing.

Peers (the `bench` extra: `pip install -e '.[bench]'`; a missing one is skipped, with the reason, never a crash):
- PISA through pyterrier-pisa: our tokens given as term counts (PisaToksIndexer, scale 1, no stemming, no stop
  words), BM25 with our k1 and b, block-max WAND over block_simdbp postings, float (unquantized) scores, queries
  as weighted term counts (a repeated word counts again, as in rank_bm25), called through its engine
  (_pisathon.retrieve) rather than its pandas transformer, whose DataFrames cost more than a query.
- tantivy through its Python bindings: our tokens joined by spaces under its whitespace tokenizer, term
  frequencies without positions, one segment, a BooleanQuery of one SHOULD TermQuery per query word.
- bm25s: its numba retrieval on the Okapi matrix this project saved (bm25s reads that format).
How each one's scores differ from rank_bm25's BM25Okapi is stated in SCORING.
"""
from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np

SCORING = {
    "ours": "rank_bm25's BM25Okapi, bit for bit (float64, negative idf floored at epsilon x mean idf)",
    "pisa": "BM25 with the same k1, b, tf and document lengths, in float32; idf log((N - df + 0.5) / (df + 0.5)) "
            "floored at 1e-6 instead of rank_bm25's epsilon x mean idf (differs only for words in more than "
            "half of the passages)",
    "tantivy": "Lucene's BM25: idf ln(1 + (N - df + 0.5) / (df + 0.5)) (never negative), k1 1.2 and b 0.75 fixed "
               "(ours: k1 1.5), no (k1 + 1) factor, document lengths rounded to one byte (fieldnorm), float32",
    "bm25s": "the same stored float32 Okapi scores as ours, summed in float32 (no exact rescoring): ties and "
             "near-ties may order differently",
}


class Engine:
    def __init__(self, name: str, search: Callable, build_s: float, index_bytes: int, **info):
        self.name, self.search, self.build_s, self.index_bytes, self.info = name, search, build_s, index_bytes, info


def dir_bytes(path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def _words(retrieval, cfg):
    bm = cfg.bm25
    return lambda q: retrieval.tokenize(q, bm.stopwords)[: bm.max_query_words]


def ours(index, path: str, build_s: float) -> Engine:
    def search(q, k, threads):
        return [(p.pid, p.score) for p in index.search([q], k)[0]]
    return Engine("ours", search, build_s, dir_bytes(path), scoring=SCORING["ours"])


def pisa(doc_words: list[list[str]], path: str, retrieval, cfg) -> Engine | str:
    try:
        import pyterrier as pt
        from pyterrier_pisa import PisaIndex, _pisathon
    except ImportError as e:
        return f"pyterrier-pisa is not installed ({e}); pip install -e '.[bench]'"
    algo = "block_max_wand"  # pyterrier-pisa's default; block_max_maxscore measured slower here on these queries
    t0 = time.perf_counter()
    idx = PisaIndex(path, stemmer="none", stops="none", threads=1)
    idx.toks_indexer(scale=1.0).index({"docno": str(i), "toks": dict(Counter(w))} for i, w in enumerate(doc_words))
    # the block-max metadata and the compressed index are written when the first retriever is prepared
    retr = idx.bm25(k1=cfg.bm25.k1, b=cfg.bm25.b, num_results=10, threads=1, query_algorithm=algo,
                    query_weighted=True, toks_scale=1.0)
    build_s = time.perf_counter() - t0
    ctxt, words = retr._ctxt, _words(retrieval, cfg)

    def search(q, k, threads):
        toks = words(q)
        if not toks:
            return []
        qid_r, doc_r = np.empty(k, dtype=np.int32), np.empty(k, dtype=object)
        rank_r, score_r = np.empty(k, dtype=np.int32), np.empty(k, dtype=np.float32)
        # threads > 1 releases the GIL while the query runs (threads = 1 holds it throughout)
        n = _pisathon.retrieve(ctxt, algo, [(0, {w: float(c) for w, c in Counter(toks).items()})], k=k,
                               threads=threads, query_weighted=1, pretokenised=True, result_qidxs=qid_r,
                               result_docnos=doc_r, result_ranks=rank_r, result_scores=score_r)
        return [(int(d), float(s)) for d, s in zip(doc_r[:n], score_r[:n])]
    return Engine("pisa", search, build_s, dir_bytes(path), scoring=SCORING["pisa"], algorithm=algo,
                  java_started=bool(pt.java.started()))


def tantivy(doc_words: list[list[str]], path: str, retrieval, cfg) -> Engine | str:
    try:
        import tantivy as tv
    except ImportError as e:
        return f"tantivy is not installed ({e}); pip install -e '.[bench]'"
    t0 = time.perf_counter()
    sb = tv.SchemaBuilder()
    sb.add_text_field("body", stored=False, tokenizer_name="whitespace", index_option="freq")
    schema = sb.build()
    index = tv.Index(schema, path=path)
    writer = index.writer(heap_size=2_000_000_000, num_threads=1)  # one thread, one segment: doc id = passage id
    for w in doc_words:
        writer.add_document(tv.Document(body=" ".join(w)))
    writer.commit()
    writer.wait_merging_threads()
    index.reload()
    searcher = index.searcher()
    build_s = time.perf_counter() - t0
    if searcher.num_segments != 1 or searcher.num_docs != len(doc_words):
        return f"tantivy wrote {searcher.num_segments} segments: passage ids cannot be read off its doc ids"
    words, should, term = _words(retrieval, cfg), tv.Occur.Should, tv.Query.term_query

    def search(q, k, threads):
        toks = words(q)
        if not toks:
            return []
        query = tv.Query.boolean_query([(should, term(schema, "body", w)) for w in toks])
        return [(a.doc, s) for s, a in searcher.search(query, k, count=False).hits]
    return Engine("tantivy", search, build_s, dir_bytes(path), scoring=SCORING["tantivy"])


def bm25s_numba(index, path: str, build_s: float, retrieval, cfg) -> Engine | str:
    import bm25s

    bm = bm25s.BM25.load(path, mmap=True, load_corpus=False, show_progress=False)
    bm.backend = "numba"
    words, vocab = _words(retrieval, cfg), index.vocab
    t0 = time.perf_counter()
    bm.retrieve([[0]], k=1, show_progress=False, n_threads=1, backend_selection="numba")
    compile_s = time.perf_counter() - t0

    def search(q, k, threads):
        ids = [vocab[w] for w in words(q) if w in vocab]
        if not ids:  # bm25s cannot take an empty query
            return []
        # one thread per call: its numba-parallel retrieval, called by two threads at once, ran at ~25 q/s here
        docs, scores = bm.retrieve([ids], k=k, show_progress=False, n_threads=1, backend_selection="numba")
        return [(int(d), float(s)) for d, s in zip(docs[0], scores[0]) if s > 0]
    return Engine("bm25s", search, build_s, dir_bytes(path), scoring=SCORING["bm25s"],
                  first_call_s=compile_s, index="this project's saved matrix (its build time is ours)")


def build_all(passages, index, index_path: str, build_s: float, retrieval, cfg, tmp: str,
              peers=("pisa", "tantivy", "bm25s")) -> tuple[list, dict]:
    """(the engines that built, {peer: why it is missing}), of ours and `peers`."""
    doc_words = [retrieval.tokenize(retrieval.doc_text(p), cfg.bm25.stopwords) for p in passages]
    engines, skipped = [ours(index, index_path, build_s)], {}
    for name, make in (("pisa", lambda d: pisa(doc_words, d, retrieval, cfg)),
                       ("tantivy", lambda d: tantivy(doc_words, d, retrieval, cfg)),
                       ("bm25s", lambda d: bm25s_numba(index, index_path, build_s, retrieval, cfg))):
        if name not in peers:
            continue
        d = os.path.join(tmp, name)
        os.makedirs(d, exist_ok=True)
        try:
            e = make(d)
        except Exception as err:  # a peer that fails is reported with its error; the others still run
            e = f"{type(err).__name__}: {err}"
        if isinstance(e, str):
            skipped[name] = e
            print(f"  peer {name} skipped: {e}", flush=True)
            shutil.rmtree(d, ignore_errors=True)
        else:
            engines.append(e)
    return engines, skipped


TITLES = {"pisa": "PISA (pyterrier-pisa, block-max WAND)", "tantivy": "tantivy 0.27", "bm25s": "bm25s numba (same matrix)"}


def single_query_table(report: dict) -> str:
    """The README's table of the single-query section of a retrieval.json: per corpus and k, each engine's q/s
    with 1 caller / 2 callers (in brackets ours / theirs, bold where ours is slower), p50 with 1 caller; then
    build seconds and index size, and each peer's top-k overlap with the exact answer."""
    corpora = [c for c in report["corpora"] if "single_query" in c]
    peers = [n for n in corpora[0]["single_query"]["engines"] if n != "ours"]
    head = ["| corpus, k | ours (exact) | " + " | ".join(TITLES.get(p, p) for p in peers) + " |",
            "|---|---|" + "---|" * len(peers)]

    def size(c):
        n = c["single_query"]["passages"]
        return "shipped" if c["requested_passages"] == "shipped" else f"{n // 1000}k" if n < 10**6 else f"{n // 10**6}M"

    def ratio(x):
        return f"**{x:.2f}x**" if x < 1 else f"{x:.2f}x" if x < 10 else f"{x:.0f}x"

    for c in corpora:
        rows = c["single_query"]["rows"]
        for k in sorted({r["k"] for r in rows}):
            one, two = [next(r for r in rows if r["k"] == k and r["threads"] == t)["engines"] for t in (1, 2)]
            cells = [f"{one['ours']['qps']:,.0f} / {two['ours']['qps']:,.0f}, p50 {one['ours']['p50_ms']:.2f} ms"]
            for p in peers:
                cells.append(f"{one[p]['qps']:,.0f} ({ratio(one[p]['ours_qps_ratio'])}) / {two[p]['qps']:,.0f} "
                             f"({ratio(two[p]['ours_qps_ratio'])}), {one[p]['p50_ms']:.2f} ms")
            head.append(f"| {size(c)}, top-{k} | " + " | ".join(cells) + " |")
    builds = "; ".join(size(c) for c in corpora)
    cells = []
    for name in ["ours"] + peers:
        es = [c["single_query"]["engines"][name] for c in corpora]
        cells.append("ours (it reads our saved matrix)" if name == "bm25s" else
                     "; ".join(f"{e['build_s']:.1f} / {e['index_bytes'] / 1e6:.0f}" for e in es))
    head.append(f"| build s / index MB ({builds}) | " + " | ".join(cells) + " |")
    cells = ["all, bit for bit"]
    for p in peers:
        per = []
        for c in corpora:
            rows = c["single_query"]["rows"]
            per.append(" / ".join(f"{next(r for r in rows if r['k'] == k and r['threads'] == 1)['engines'][p]['agreement']['mean_topk_overlap']:.2f}"
                                  for k in sorted({r["k"] for r in rows})))
        cells.append("; ".join(per))
    ks = " / ".join(str(k) for k in sorted({r["k"] for r in corpora[0]["single_query"]["rows"]}))
    head.append(f"| top-k ids shared with the exact answer, k {ks} ({builds}) | " + " | ".join(cells) + " |")
    return "\n".join(head) + "\n"
