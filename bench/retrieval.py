"""Retrieval benchmark: rank_bm25 (reference) and bm25s side by side, on the shipped corpus and scaled corpora.
In each bm25s child, on the same index and queries, in the same run: today's kernel (searchr1.retrieval.bm25_topk.top_k_exact,
via Index.search), the previous one (bench/bm25_previous.py, the code of b4dff5f) and bm25s's own numba
retrieval on the saved Okapi matrix (the peer; given our tokens, it returns ids and float32 scores only).

    python bench/retrieval.py --quick     # shipped corpus (256 rank_bm25 queries) + 10k scaled passages, < 2 min
    nice python bench/retrieval.py        # shipped corpus + 100k + 1M scaled passages (heavy: run it alone)

Scaled corpora keep the vocabulary real: the shipped passages first, then passages that reuse a shipped
passage's title (numbered) and sentence count, with sentences drawn at random (seeded) from every shipped
paragraph. Each (corpus, backend) runs in its own child process so that its peak memory is its own: it builds
the index, saves it, loads it back memory-mapped (as a rollout rank does), then times batches of 512 queries at
top-3. Queries are the shipped questions' text, and odd ones (repeated words, stop words only, unknown words,
numbers, accents, queries cut at max_query_words). rank_bm25 answers a sample of queries where it is too slow
for all of them. Agreement: top-3 against rank_bm25's: identical ids and identical scores (bit for bit), or
identical up to tied scores; today's kernel is also checked equal to the previous one on every timed query.
Writes results/bench/retrieval[_quick].json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # its sibling modules, also when imported from elsewhere

import numpy as np  # noqa: E402

import bm25_previous  # noqa: E402
import retrieval_peers  # noqa: E402
from searchr1 import retrieval  # noqa: E402 (build_index, save_index, load_index)
from searchr1.retrieval import bm25 as bm25_backend  # noqa: E402 (its tokenizer, for the peers)
from searchr1.retrieval.bm25 import tokenize  # noqa: E402
from searchr1.config import BM25Config, DataConfig, RetrieverConfig  # noqa: E402
from searchr1.data import load_questions, load_splits  # noqa: E402

BATCH = 512
TOP_K = 3
N_QUERIES = 1000
SEED = 0


def shipped_questions():
    files = sorted((ROOT / "data" / "hotpotqa").glob("*/*.json*"))
    return load_questions(files)


def real_queries(n: int) -> list[str]:
    seen, out = set(), []
    for q in shipped_questions():
        if q.question not in seen:
            seen.add(q.question)
            out.append(q.question)
    if len(out) < n:
        raise SystemExit(f"only {len(out)} distinct shipped questions, need {n}")
    return out[:n]


def odd_queries(n: int) -> list[str]:
    """Queries of the shapes retrieval gets wrong most easily, drawn from the shipped text (seeded)."""
    rng = np.random.default_rng(SEED + 1)
    words = [w for p in load_splits(DataConfig(), root=ROOT).corpus[:500] for w in tokenize(p["text"])]
    fixed = ["the the the", "of", "in the", "what is the", "1 2 3 2019", "Beyoncé Beyonce", "zzqx the",
             "the " * 40 + "paris", "who who who was was the first", "", "   ", "??!", "qwertyuiopasdf"]
    out = list(fixed)
    while len(out) < n:
        m = int(rng.integers(1, 80))
        ws = [words[int(i)] for i in rng.integers(0, len(words), m)]
        if rng.random() < 0.3:
            ws = ws[:3] * 5  # repeats
        out.append(" ".join(ws))
    return out[:n]


def corpus(n: int) -> list[dict]:
    """The shipped corpus, extended to n passages by recombining real sentences (n=0: shipped only)."""
    base = load_splits(DataConfig(), root=ROOT).corpus
    if n <= len(base):
        return base
    paragraphs = {}
    for q in shipped_questions():
        for title, sents in q.context:
            paragraphs.setdefault(title, sents)
    pool = [s for sents in paragraphs.values() for s in sents]
    rng = np.random.default_rng(SEED)
    n_new = n - len(base)
    template = rng.integers(0, len(base), n_new)
    n_sent = np.array([max(1, len(paragraphs.get(p["title"], ("",)))) for p in base])[template]
    picks = rng.integers(0, len(pool), int(n_sent.sum()))
    out, at = list(base), 0
    for j in range(n_new):
        sents = [pool[i] for i in picks[at: at + n_sent[j]]]
        at += n_sent[j]
        out.append({"title": f"{base[template[j]]['title']} ({j})", "text": "".join(sents).strip()})
    return out


def _qps(fn, queries: list[str], reps: int) -> float:
    """Best wall-clock q/s over `reps` runs of `fn` on `queries` in batches of BATCH."""
    best = 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        for i in range(0, len(queries), BATCH):
            fn(queries[i: i + BATCH])
        best = max(best, len(queries) / (time.perf_counter() - t0))
    return best


def child(spec: dict) -> dict:
    """One backend on one corpus, in this process alone: build, save, mmap-load, query."""
    queries = real_queries(N_QUERIES)
    odd = odd_queries(spec["odd"])
    passages = corpus(spec["n"])
    rss_corpus = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    cfg = RetrieverConfig(name=spec["backend"], top_k=TOP_K,
                          bm25=BM25Config(threads=spec["threads"], stopwords=spec["stopwords"]))
    out = {"passages": len(passages), "backend": spec["backend"], "threads": cfg.bm25.threads or os.cpu_count(),
           "stopwords": cfg.bm25.stopwords, "load_avg_at_start": os.getloadavg()}
    t0 = time.perf_counter()
    index = retrieval.build_index(passages, cfg)
    out["build_s"] = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(dir=spec["tmp"]) as d:
        if spec["persist"]:
            t0 = time.perf_counter()
            retrieval.save_index(index, d)
            out["save_s"] = time.perf_counter() - t0
            out["index_bytes"] = sum(f.stat().st_size for f in Path(d).iterdir())
            del index
            t0 = time.perf_counter()
            index = retrieval.load_index(d, passages, cfg)  # hashes the corpus and every file, maps the arrays
            out["load_s"] = time.perf_counter() - t0
        index.search(queries[:8])  # compiles (or loads) the numba kernels
        timed = queries[: spec["timed"]] if spec["timed"] else [queries[i % len(queries)] for i in range(2 * BATCH)]
        reps = 1 if spec["timed"] else 3
        if spec["backend"] == "bm25s":
            pool = ThreadPoolExecutor(out["threads"])
            bm25_previous.search(index, queries[:8], TOP_K, pool=pool)
            new_qps, prev_qps = [], []
            for _ in range(reps):  # alternated, so that both see the same machine
                new_qps.append(_qps(lambda b: index.search(b), timed, 1))
                prev_qps.append(_qps(lambda b: bm25_previous.search(index, b, TOP_K, pool=pool), timed, 1))
            out["qps"], out["qps_previous_kernel"] = max(new_qps), max(prev_qps)
            out["qps_ratio_vs_previous_kernel"] = out["qps"] / out["qps_previous_kernel"]
            same = sum([(p.pid, p.score) for p in a] == [(p.pid, p.score) for p in b]
                       for a, b in zip(index.search(timed), bm25_previous.search(index, timed, TOP_K, pool=pool)))
            out["previous_kernel_identical"] = same / len(timed)
            if spec["persist"]:
                out.update(bm25s_numba(d, index, timed, out["threads"]))
                out["qps_ratio_vs_bm25s_numba"] = out["qps"] / out["qps_bm25s_numba"]
        else:
            out["qps"] = _qps(lambda b: index.search(b), timed, reps)
        out["queries_timed"] = len(timed)
        agree = queries[: spec["agree"]] + odd
        out["top"] = [[(p.pid, p.score) for p in h] for h in index.search(agree)]  # the same lists in every child
    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    out["corpus_rss_gib"] = rss_corpus
    return out


def bm25s_numba(path: str, index, queries: list[str], threads: int) -> dict:
    """bm25s's own numba retrieval on our saved matrix (its compile, ~15 s once per process, excluded)."""
    import bm25s

    bm = bm25s.BM25.load(path, mmap=True, load_corpus=False, show_progress=False)
    bm.backend = "numba"

    def run(batch):
        toks = [tokenize(q, index.cfg.bm25.stopwords)[: index.cfg.bm25.max_query_words] for q in batch]
        ids = [[index.vocab[w] for w in t if w in index.vocab] for t in toks]
        ids = [x for x in ids if x]  # bm25s cannot take an empty query
        return bm.retrieve(ids, k=TOP_K, show_progress=False, n_threads=threads, backend_selection="numba")

    t0 = time.perf_counter()
    run(queries[:8])
    compile_s = time.perf_counter() - t0
    return {"qps_bm25s_numba": _qps(run, queries, 3), "bm25s_numba_first_call_s": compile_s}


# the single-query section: the agent's access pattern (a turn's few queries, one call each), not batches
SINGLE_K = (3, 10, 1000)
SINGLE_THREADS = (1, 2)


def timed_calls(search, queries: list[str], k: int, threads: int) -> tuple[float, list[float]]:
    """q/s of one query per call, `threads` callers at once (each gets every threads-th query), and each call's
    latency (wall clock: the machine is shared, so only ratios within one round are compared)."""
    lat = [0.0] * len(queries)

    def work(idx):
        for i in idx:
            t0 = time.perf_counter()
            search(queries[i], k, threads)
            lat[i] = time.perf_counter() - t0

    t0 = time.perf_counter()
    if threads == 1:
        work(range(len(queries)))
    else:
        callers = [threading.Thread(target=work, args=(range(j, len(queries), threads),)) for j in range(threads)]
        for c in callers:
            c.start()
        for c in callers:
            c.join()
    return len(queries) / (time.perf_counter() - t0), lat


def overlap(exact: list, got: list) -> dict:
    """A peer's answers against the exact ones (ours, which the batch section checks against rank_bm25 bit for
    bit): mean share of the exact top-k ids that the peer returns, queries whose ranked ids are identical, and
    queries whose ids and scores are identical."""
    share = [len({p for p, _ in g} & {p for p, _ in e}) / len(e) for e, g in zip(exact, got) if e]
    return {"queries": len(exact), "mean_topk_overlap": float(np.mean(share)) if share else None,
            "ranked_ids_identical": sum([p for p, _ in e] == [p for p, _ in g] for e, g in zip(exact, got)),
            "ids_and_scores_identical": sum(e == g for e, g in zip(exact, got))}


def single_query_child(spec: dict) -> dict:
    """This kernel and every installed peer on one corpus, in this process: build each, then for each k and
    thread count, rounds in which every engine answers the same queries one call at a time, in a rotating
    order (so that each sees the same machine); agreement with the exact answer at each k."""
    passages = corpus(spec["n"])[: spec.get("cap") or None]
    queries = real_queries(N_QUERIES)[: spec["queries"]]
    cfg = RetrieverConfig(name="bm25s", top_k=3, bm25=BM25Config(threads=1))
    out = {"passages": len(passages), "queries": len(queries), "rounds": spec["rounds"],
           "load_avg_at_start": os.getloadavg()}
    t0 = time.perf_counter()
    index = retrieval.build_index(passages, cfg)
    build_s = time.perf_counter() - t0
    ours_dir = os.path.join(spec["tmp"], "ours")
    os.makedirs(ours_dir)
    retrieval.save_index(index, ours_dir)
    index = retrieval.load_index(ours_dir, passages, cfg)  # memory-mapped, as a rollout rank serves it
    engines, out["skipped"] = retrieval_peers.build_all(passages, index, ours_dir, build_s, bm25_backend, cfg,
                                                        spec["tmp"], spec.get("peers", ("pisa", "tantivy", "bm25s")))
    out["engines"] = {e.name: {"build_s": e.build_s, "index_bytes": e.index_bytes, **e.info} for e in engines}
    ks = spec.get("k", SINGLE_K)
    for e in engines:
        for k in ks:
            e.search(queries[0], min(k, len(passages)), 1)  # compiles, maps and warms what each engine loads lazily
    rows = []
    for k in ks:
        answers = {e.name: [e.search(q, min(k, len(passages)), 1) for q in queries] for e in engines}
        agree = {n: overlap(answers["ours"], a) for n, a in answers.items() if n != "ours"}
        for threads in SINGLE_THREADS:
            qps, lat = {e.name: [] for e in engines}, {e.name: [] for e in engines}
            for r in range(spec["rounds"]):
                for e in engines[r % len(engines):] + engines[: r % len(engines)]:
                    q, l_ = timed_calls(e.search, queries, min(k, len(passages)), threads)
                    qps[e.name].append(q)
                    lat[e.name] += l_
            row = {"k": k, "threads": threads, "engines": {}}
            for name in qps:
                row["engines"][name] = {"qps": max(qps[name]), "qps_rounds": qps[name],
                                        "p50_ms": 1e3 * float(np.percentile(lat[name], 50)),
                                        "p99_ms": 1e3 * float(np.percentile(lat[name], 99))}
                if name != "ours":
                    mine, theirs = row["engines"]["ours"], row["engines"][name]
                    theirs["ours_qps_ratio"] = mine["qps"] / theirs["qps"]
                    theirs["ours_p50_ratio"] = theirs["p50_ms"] / mine["p50_ms"]  # > 1: ours answers sooner
                    theirs["agreement"] = agree[name]
            print(f"  single k={k} threads={threads}: " + ", ".join(
                f"{n} {v['qps']:.0f} q/s p50 {v['p50_ms']:.3f} ms" for n, v in row["engines"].items()), flush=True)
            rows.append(row)
    out["rows"] = rows
    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return out


def single_query_section(n: int, args, tmp: str) -> dict:
    """The single-query section of one corpus, in a child of its own (its peak memory is its own)."""
    n_queries = 64 if args.quick else 200
    d = tempfile.mkdtemp(prefix="single-", dir=tmp)
    spec = {"single": True, "backend": "single-query section", "n": n, "tmp": d, "queries": n_queries,
            "rounds": 1 if args.quick else args.rounds}
    res = run_child(spec, None)
    shutil.rmtree(d, ignore_errors=True)
    return res


def run_child(spec: dict, mem_limit_gib: float | None) -> dict:
    with tempfile.NamedTemporaryFile("r", suffix=".json") as f:
        cmd = [sys.executable, __file__, "--child", json.dumps({**spec, "out": f.name})]
        pre = None
        if mem_limit_gib:
            lim = int(mem_limit_gib * 2**30)
            pre = lambda: resource.setrlimit(resource.RLIMIT_AS, (lim, lim))  # noqa: E731
        t0 = time.perf_counter()
        p = subprocess.run(cmd, preexec_fn=pre, capture_output=True, text=True)
        if p.returncode != 0:
            tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
            print(f"  {spec['backend']} at {spec['n']}: failed: {' | '.join(tail)}", flush=True)
            return {"backend": spec["backend"], "failed": " | ".join(tail), "wall_s": time.perf_counter() - t0}
        return json.load(open(f.name))


def available_gib() -> float:
    with open("/proc/meminfo") as f:
        info = dict(line.split(":", 1) for line in f)
    return int(info["MemAvailable"].split()[0]) / 2**20


def agreement(ref: list, fast: list, n_real: int) -> dict:
    """Per query set (real questions, odd queries): identical ids and scores (bit for bit); identical up to ties
    (the same score at every rank); the largest score gap."""
    def one(r_list, f_list):
        same = exact = tie_same = 0
        gap = 0.0
        for r, f in zip(r_list, f_list):
            same += [p for p, _ in r] == [p for p, _ in f]
            exact += r == f
            tie_same += len(r) == len(f) and all(a[1] == b[1] for a, b in zip(r, f))
            ref_score = dict((p, s) for p, s in r)
            gap = max([gap] + [abs(ref_score[p] - s) for p, s in f if p in ref_score])
        n = len(r_list)
        return {"queries": n, "top3_ids_identical": same, "top3_ids_and_scores_identical": exact,
                "top3_identical_up_to_ties": tie_same, "max_abs_score_diff_same_pid": gap}
    return {"real": one(ref[:n_real], fast[:n_real]), "odd": one(ref[n_real:], fast[n_real:])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shipped corpus (256 reference queries) + 10k passages")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", type=int, nargs="*", help="scaled corpus sizes (default: 100000 1000000)")
    ap.add_argument("--rank-bm25-mem-gib", type=float, default=14.0,
                    help="address-space limit of a rank_bm25 child (its 1M index is many GiB of dicts)")
    ap.add_argument("--no-shipped", action="store_true", help="skip the shipped corpus (rerun scaled sizes only)")
    ap.add_argument("--out", help="output JSON (default: results/bench/retrieval[_quick].json)")
    ap.add_argument("--no-batch", action="store_true", help="skip the batch section (rank_bm25, batches of 512)")
    ap.add_argument("--no-single", action="store_true", help="skip the single-query section (peers)")
    ap.add_argument("--rounds", type=int, default=3, help="single-query section: rounds per (k, threads)")
    ap.add_argument("--ref-queries", type=int, default=0, help="at most this many rank_bm25 queries per corpus")
    ap.add_argument("--batch-runs", default="", help="only these runs of the batch section (comma-separated names)")
    ap.add_argument("--table", metavar="JSON", help="print the README's single-query table of a written JSON")
    args = ap.parse_args()
    if args.table:
        print(retrieval_peers.single_query_table(json.loads(Path(args.table).read_text())), end="")
        return
    if args.child:
        spec = json.loads(args.child)
        res = single_query_child(spec) if spec.get("single") else child(spec)
        json.dump(res, open(spec["out"], "w"))
        return
    sizes = [10_000] if args.quick else (args.sizes or [100_000, 1_000_000])
    # rank_bm25 queries per corpus: all 1,000 on the shipped corpus, a sample where one query takes seconds
    ref_queries = {0: 256, 10_000: 32} if args.quick else {0: N_QUERIES, 100_000: 64, 1_000_000: 8}
    if args.ref_queries:
        ref_queries = {n: min(q, args.ref_queries) for n, q in ref_queries.items()}
    # odd queries checked against rank_bm25 per corpus (on top of the real ones)
    odd_n = {0: 200, 10_000: 16} if args.quick else {0: 200, 100_000: 32, 1_000_000: 8}
    tmp = tempfile.mkdtemp(prefix="bench-retrieval-")
    report = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg_at_start": os.getloadavg()},
              "settings": {**asdict(RetrieverConfig()), "batch": BATCH, "top_k": TOP_K, "quick": args.quick},
              "corpora": []}
    for n in ([] if args.no_shipped else [0]) + sizes:
        n_ref, n_odd = ref_queries.get(n, 16), odd_n.get(n, 8)
        row = {"requested_passages": n or "shipped"}
        print(f"corpus {n or 'shipped'}:", flush=True)
        runs = {}  # name -> (spec, reference run name or None)
        plan = [("rank_bm25", "rank_bm25", 1, "none", None), ("bm25s", "bm25s", 0, "none", "rank_bm25")]
        if not args.quick:
            if n < 1_000_000:
                plan.append(("bm25s_1thread", "bm25s", 1, "none", "rank_bm25"))
                plan.append(("rank_bm25_stopwords_en", "rank_bm25", 1, "en", None))
            plan.append(("bm25s_stopwords_en", "bm25s", 0, "en", "rank_bm25_stopwords_en"))
        if args.batch_runs:
            plan = [p for p in plan if p[0] in args.batch_runs.split(",")]
        if args.no_batch:
            plan = []
        for name, backend, threads, stop, ref_name in plan:
            ref = backend == "rank_bm25"
            mem_gib = available_gib()
            if ref and n >= 1_000_000 and mem_gib < args.rank_bm25_mem_gib + 4:
                runs[name] = {"skipped": f"only {mem_gib:.1f} GiB available on this shared machine"}
            else:
                spec = {"n": n, "backend": backend, "threads": threads, "stopwords": stop, "tmp": tmp,
                        "timed": n_ref if ref else 0, "agree": n_ref, "odd": n_odd,
                        "persist": not (ref and n >= 1_000_000)}  # a 1M rank_bm25 pickle is many GiB
                runs[name] = run_child(spec, args.rank_bm25_mem_gib if ref else None)
            r = runs[name]
            row[name] = {k: v for k, v in r.items() if k != "top"}
            base = runs.get(ref_name) if ref_name else None
            if base and "qps" in base and "qps" in r:
                row[name]["qps_ratio_vs_rank_bm25"] = r["qps"] / base["qps"]
                row[name]["agreement_with_rank_bm25"] = agreement(base["top"], r["top"], n_ref)
            print(f"  {name}: {json.dumps(row[name])}", flush=True)
        if not args.no_single:
            row["single_query"] = single_query_section(n, args, tmp)
        report["corpora"].append(row)
    shutil.rmtree(tmp, ignore_errors=True)
    out = Path(args.out) if args.out else ROOT / "results" / "bench" / (
        "retrieval_quick.json" if args.quick else "retrieval.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
