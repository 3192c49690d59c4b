"""The on-disk cache of retrieval indexes: one folder per (corpus, settings), a manifest of every file's size and
sha256, built by one rank under a file lock while the others wait, renamed into place so a crash never leaves a
half-written index under its final name; a damaged or foreign cache is rejected by name and rebuilt."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from typing import TYPE_CHECKING

from searchr1.flock import exclusive
from searchr1.retrieval.base import Index, IndexCorrupt, backend, build_index, check_passages, corpus_hash

if TYPE_CHECKING:
    from searchr1.config import RetrieverConfig

log = logging.getLogger(__name__)
_MANIFEST = "manifest.json"


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _difference(key: str, built, need) -> str:
    """The first setting where a saved index differs from what is needed, by its dotted name."""
    if isinstance(built, dict) and isinstance(need, dict):
        for k in sorted(set(built) | set(need), key=str):
            if built.get(k) != need.get(k):
                return _difference(f"{key}.{k}", built.get(k), need.get(k))
    return f"{key}={built!r}, need {need!r}"


def save_index(index: Index, path: str, corpus_sha256: str | None = None) -> None:
    """Write `index` into the new or empty folder `path` with a manifest of every file's size and sha256."""
    os.makedirs(path, exist_ok=True)
    extra = index.save(path)
    files = {n: {"size": os.path.getsize(os.path.join(path, n)), "sha256": _sha256_file(os.path.join(path, n))}
             for n in sorted(os.listdir(path)) if n != _MANIFEST}
    manifest = {"settings": type(index).settings(index.cfg), "corpus_sha256": corpus_sha256 or corpus_hash(index.passages),
                "passages": len(index.passages), "files": files, **extra}
    with open(os.path.join(path, _MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)


def load_index(path: str, passages: list[dict], cfg: RetrieverConfig, corpus_sha256: str | None = None) -> Index:
    """Load a saved index after checking it was built for this corpus and these settings and is intact;
    raise IndexCorrupt otherwise."""
    try:
        with open(os.path.join(path, _MANIFEST)) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise IndexCorrupt(f"{path}/{_MANIFEST}: unreadable ({e})") from e
    want = {"settings": backend(cfg).settings(cfg), "corpus_sha256": corpus_sha256 or corpus_hash(passages)}
    for key, value in want.items():
        if manifest.get(key) != value:
            raise IndexCorrupt(f"{path}: built with {_difference(key, manifest.get(key), value)}")
    files = manifest.get("files")
    present = set(os.listdir(path)) - {_MANIFEST}
    if not isinstance(files, dict) or set(files) != present:
        raise IndexCorrupt(f"{path}: files {sorted(present)} differ from the manifest's list")
    for name, meta in files.items():
        fp = os.path.join(path, name)
        if not isinstance(meta, dict) or os.path.getsize(fp) != meta.get("size") or _sha256_file(fp) != meta.get(
                "sha256"):
            raise IndexCorrupt(f"{fp}: damaged (size/sha256 differ from the manifest)")
    return backend(cfg).load(path, passages, cfg, manifest)


def load_or_build(passages: list[dict], cfg: RetrieverConfig, cache_dir: str | None = None) -> Index:
    """The index for `passages`, from the cache when an intact one exists, else built and cached.

    The cache folder is keyed by corpus hash and settings. Ranks that start together take a file lock, so one
    builds while the others wait and then memory-map its result; the build is written to a temporary folder and
    renamed into place, so a crash never leaves a half-written index under the final name."""
    check_passages(passages)
    cls = backend(cfg)
    if cls.composite:  # no files of its own: its parts come from (and go into) this same cache
        return cls.from_parts(passages, cfg, lambda part_cfg: load_or_build(passages, part_cfg, cache_dir))
    root = os.path.expanduser(cache_dir or cfg.cache_dir)
    os.makedirs(root, exist_ok=True)
    sha = corpus_hash(passages)
    key = hashlib.sha256(json.dumps([sha, cls.settings(cfg)], sort_keys=True).encode()).hexdigest()[:24]
    final = os.path.join(root, f"{cfg.name}-{key}")
    with exclusive(final + ".lock"):
        if os.path.isdir(final):
            try:
                index = load_index(final, passages, cfg, sha)
                log.info("retrieval: loaded %s index of %d passages from %s", cfg.name, len(passages), final)
                return index
            except IndexCorrupt as e:
                log.warning("retrieval: cached index rejected, rebuilding: %s", e)
                trash = tempfile.mkdtemp(prefix=f".{os.path.basename(final)}.bad-", dir=root)
                os.rename(final, os.path.join(trash, "index"))
                shutil.rmtree(trash, ignore_errors=True)
        t0 = time.perf_counter()
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(final)}.tmp-", dir=root)
        try:
            save_index(build_index(passages, cfg), tmp, sha)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log.info("retrieval: built %s index of %d passages in %.1f s into %s", cfg.name, len(passages),
                 time.perf_counter() - t0, final)
        return load_index(final, passages, cfg, sha)
