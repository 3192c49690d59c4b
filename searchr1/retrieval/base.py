"""What every retrieval backend shares: the `Index` interface (a batch of queries in, each query's top-k passages
out, ranked by (score desc, passage id asc)), the hit type, the agent's search tool and its information text.

A backend is a subclass with `build` (index passages in memory), `save` / `load` (its files in a cache folder,
searchr1/retrieval/cache.py) and `settings` (everything its saved files depend on, so the cache can refuse an
index built with other settings by name); a composite backend (hybrid) has no files of its own and sets
`composite = True`, with `from_parts` building it from its parts' cached indexes.
"""
from __future__ import annotations

import hashlib
import time
from typing import TYPE_CHECKING, Callable, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from searchr1.config import RetrieverConfig


NO_RESULTS = "No documents matched this query. Try different search terms."


class IndexCorrupt(RuntimeError):
    """A saved index that cannot be served: missing, damaged, or built for another corpus or settings."""


class Passage(NamedTuple):
    """One hit (immutable; a named tuple because a batch builds thousands, ~5x faster than a frozen dataclass)."""

    pid: int
    title: str
    text: str
    score: float


def doc_text(passage: dict) -> str:
    """What a passage is indexed as, by every backend: its title, a newline, its text."""
    return passage["title"] + "\n" + passage["text"]


def check_passages(passages) -> None:
    if not isinstance(passages, (list, tuple)) or not passages:
        raise ValueError(f"passages: need a non-empty list of dicts with 'title' and 'text', got {type(passages)}")
    for i, p in enumerate(passages):
        for field in ("title", "text"):
            if not isinstance(p, dict) or not isinstance(p.get(field), str):
                raise ValueError(f"passages[{i}]: field {field!r} missing or not a string ({str(p)[:80]!r})")


def corpus_hash(passages: list[dict]) -> str:
    """sha256 over titles and texts, length-prefixed so that no two corpora collide by concatenation."""
    h = hashlib.sha256()
    for p in passages:
        t, x = p["title"].encode(), p["text"].encode()
        h.update(b"%d:%s%d:%s" % (len(t), t, len(x), x))
    return h.hexdigest()


def rank(pids, scores, k: int, positive_only: bool = True) -> list[tuple[int, float]]:
    """Best k by (score desc, pid asc); BM25 drops passages with no shared term (score <= 0), dense keeps all."""
    if len(scores) > k:  # only passages tied with or above the k-th score can make it
        keep = np.flatnonzero(scores >= np.partition(scores, -k)[-k])
        pids, scores = pids[keep], scores[keep]
    order = np.lexsort((pids, -scores))[:k]
    return [(int(pids[i]), float(scores[i])) for i in order if scores[i] > 0 or not positive_only]


class Index:
    """Batch search over a fixed list of passages; subclasses score, this class handles queries and hits."""

    backend = ""
    composite = False

    def __init__(self, passages: list[dict], cfg: RetrieverConfig):
        self.passages = passages
        self.cfg = cfg
        self.search_seconds = 0.0  # totals for the rollout's metrics (retrieval time vs generation time)
        self.searched_queries = 0
        self._titles = self._texts = None

    def __len__(self) -> int:
        return len(self.passages)

    def search(self, queries: list[str], k: int | None = None) -> list[list[Passage]]:
        """Top-k passages per query, best first; an empty query, or one of unknown words only, gets []."""
        if isinstance(queries, str) or not all(isinstance(q, str) for q in queries):
            raise TypeError(f"queries: need a list of strings, got {str(queries)[:80]!r}")
        k = self.cfg.top_k if k is None else k
        if not isinstance(k, int) or k <= 0:
            raise ValueError(f"k={k!r}: must be a positive int")
        t0 = time.perf_counter()
        hits = self.top_k_text(queries, min(k, len(self.passages)))
        if self._titles is None:  # passages' fields as lists: a hit's Passage is two list reads, not two dict ones
            self._titles, self._texts = [p["title"] for p in self.passages], [p["text"] for p in self.passages]
        titles, texts = self._titles, self._texts
        out = [[Passage(pid, titles[pid], texts[pid], score) for pid, score in h] for h in hits]
        self.search_seconds += time.perf_counter() - t0
        self.searched_queries += len(queries)
        return out

    def top_k_text(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        """Each query's (passage id, score) hits, best first."""
        raise TypeError(f"{type(self).__name__} is not a backend; use build_index or load_or_build")

    @classmethod
    def settings(cls, cfg: RetrieverConfig) -> dict:
        """Everything the saved index depends on (query-time knobs such as top_k are left out)."""
        raise TypeError(f"{cls.__name__} is not a backend")

    def save(self, path: str) -> dict:
        """Write the backend's files into the existing folder `path`; return the manifest entries to record."""
        raise TypeError(f"{type(self).__name__} is not a backend; use build_index or load_or_build")

    @classmethod
    def compile_kernels(cls, cfg: RetrieverConfig) -> None:
        """Compile, into an on-disk cache, what this backend's searches would otherwise compile in every process:
        `make install` and launch's prepare step call it before any rank starts. Nothing by default."""


def backend(cfg: RetrieverConfig) -> type[Index]:
    from searchr1.registry import RETRIEVERS, resolve

    return resolve(RETRIEVERS, cfg.name, "retriever.name")


def build_index(passages: list[dict], cfg: RetrieverConfig) -> Index:
    """Index `passages` (dicts with 'title' and 'text') in memory with the backend `cfg.name`."""
    check_passages(passages)
    return backend(cfg).build(passages, cfg)


def make_retrieve(index: Index, tokenizer, cfg: RetrieverConfig) -> Callable[[list[str]], list[str]]:
    """The agent's search tool: one batched call per turn, each hit list as Search-R1's information text."""
    def retrieve(queries: list[str]) -> list[str]:
        return [format_passages(p, tokenizer, cfg.passage_max_tokens) for p in index.search(queries, cfg.top_k)]
    return retrieve


def format_passages(passages: list[Passage], tokenizer, max_tokens: int) -> str:
    """Search-R1's information text: 'Doc i(Title: t) text' lines, each text cut to `max_tokens` tokens of the
    policy's tokenizer; a clear sentence when nothing matched, so the agent knows to search differently."""
    if max_tokens <= 0:
        raise ValueError(f"max_tokens={max_tokens!r}: must be > 0")
    if not passages:
        return NO_RESULTS
    ids = tokenizer([p.text for p in passages], add_special_tokens=False)["input_ids"]
    lines = []
    for i, (p, ids_t) in enumerate(zip(passages, ids), start=1):
        # a cut inside a multi-byte character decodes to U+FFFD; drop that fragment
        text = p.text if len(ids_t) <= max_tokens else tokenizer.decode(ids_t[:max_tokens]).rstrip("\ufffd")
        lines.append(f"Doc {i}(Title: {p.title}) {text}")
    return "\n".join(lines)
