"""What an installation compiles once, so that no run pays for it: the delta codec's C++ kernel
(weightsync/kernel.py) and the bm25s query kernel's numba functions (retrieval/bm25.py). `make install` runs this
beside pip's byte-compiling (each single-threaded, on a 2-core machine both cores busy). Neither is required: a
codec kernel that cannot be built leaves the torch path (exit 0 unless --strict), and numba compiles in a run's
first search what it finds no cache for (launch's prepare step compiles it once before any rank starts:
`Index.compile_kernels`)."""
from __future__ import annotations

import logging
import sys
import time
from typing import Optional

from searchr1.weightsync import kernel


def main(argv: Optional[list[str]] = None) -> int:
    rc = kernel.main(argv)  # its flags (--wait-s, --strict) and its report
    from searchr1.retrieval import bm25_topk
    from searchr1.retrieval.bm25 import BM25sIndex
    from searchr1.retrieval.schema import RetrieverConfig

    t0 = time.perf_counter()
    BM25sIndex.compile_kernels(RetrieverConfig(name="bm25s"))
    logging.getLogger(__name__).info("bm25s query kernel: ready in %.0f s (numba cache in %s)",
                                     time.perf_counter() - t0, bm25_topk._top_k_exact.stats.cache_path)
    return rc


if __name__ == "__main__":
    sys.exit(main())
