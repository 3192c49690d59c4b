"""`make install`'s prebuild step: the bm25s query kernel compiled into numba's on-disk cache, so that a run's
first search on a fresh clone loads it instead of compiling it (once per rank, all at once). Checked by numba's own
per-process cache statistics in fresh interpreters sharing one NUMBA_CACHE_DIR, not by timing."""
import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# a run's layout: another corpus, cached on disk and memory-mapped back, searched with a batch of queries
SEARCH = """
    import json, sys
    from searchr1.retrieval import load_or_build
    from searchr1.retrieval import bm25_scores, bm25_topk
    from searchr1.retrieval.schema import RetrieverConfig
    ps = [{"id": str(i), "title": f"Town {i}", "text": f"river {i % 7} bridge {i} built in year {1800 + i}"}
          for i in range(200)]
    ix = load_or_build(ps, RetrieverConfig(name="bm25s", top_k=3), cache_dir=sys.argv[1])
    hits = ix.search(["river 3 bridge", "year 1850", "no such words"], 3)
    assert hits[1][0].title == "Town 50", hits[1]
    fns = (bm25_topk._top_k_exact, bm25_scores.max_impacts)
    print(json.dumps({f.__name__: [sum(f.stats.cache_hits.values()), sum(f.stats.cache_misses.values())]
                      for f in fns}))
"""


def _python(code, *args, env):
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout.strip().splitlines()[-1]


def test_prebuilt_query_kernel_is_loaded_not_compiled_by_a_run(tmp_path):
    # No cold run first: without the prebuild the run's search would compile, a cache miss that fails the last
    # assertion by itself (a cold compile is 40-50 s of an AVX2 core that the suite does not need to spend).
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "PYTHONPATH": ROOT}
    where = _python("""
        from searchr1.retrieval import bm25_topk
        from searchr1.retrieval.bm25 import BM25sIndex
        from searchr1.retrieval.schema import RetrieverConfig
        BM25sIndex.compile_kernels(RetrieverConfig(name="bm25s"))
        print(bm25_topk._top_k_exact.stats.cache_path)
    """, env=env)
    assert where.startswith(str(tmp_path / "numba")), where
    warm = json.loads(_python(SEARCH, str(tmp_path / "ix"), env=env))
    assert all(hit > 0 and miss == 0 for hit, miss in warm.values()), warm
