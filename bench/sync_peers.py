"""The published delta codecs of bench/weight_sync.py, re-implemented from their descriptions (no code of theirs),
each an (encode, decode) pair over lists of int16 views of bf16 tensors (old, new), bit-exact, zstd level 1 on
one thread where the codec compresses; and the entropy bound of a step's change.

- PULSE (Miahi and Belilovsky, 2026, "PULSESync"): per tensor the changed positions as COO, sorted, row gaps as
  uint8 (int32 when one exceeds 255), column gaps within a row (absolute at a new row) as uint16 (int32 when one
  exceeds 65535), then the new values verbatim (bf16 bits); every tensor's streams in one zstd-1 frame.
- slime: the XOR of the new and old bit patterns of every element, zstd-1, one frame per tensor.
- verl: per tensor (a shard) the changed positions as absolute int32 indices and the new values as bf16, sent as
  they are (no entropy coding).
"""
from __future__ import annotations

import math

import numpy as np
import torch


def _cols(shape: tuple) -> int:
    return math.prod(shape[1:]) if len(shape) > 1 else 1


def _gaps(x: np.ndarray, narrow) -> np.ndarray:
    return x.astype(narrow) if x.size == 0 or x.max() <= np.iinfo(narrow).max else x.astype(np.int32)


def pulse_encode(old: list, new: list, shapes: list, cctx) -> bytes:
    parts = []
    for o, n, shape in zip(old, new, shapes):
        idx = torch.ne(o, n).nonzero().squeeze(1).numpy()
        rows, cols = np.divmod(idx, _cols(shape))
        d_rows = np.diff(rows, prepend=0)
        d_cols = cols.copy()
        same = np.zeros(len(idx), dtype=bool)
        same[1:] = d_rows[1:] == 0
        d_cols[same] = cols[same] - cols[np.flatnonzero(same) - 1]
        r, c = _gaps(d_rows, np.uint8), _gaps(d_cols, np.uint16)
        head = np.array([len(idx), r.itemsize, c.itemsize], dtype=np.int64)
        parts += [head.tobytes(), r.tobytes(), c.tobytes(), n.numpy()[idx].tobytes()]
    return cctx.compress(b"".join(parts))


def pulse_decode(blob: bytes, tgt: list, old: list, shapes: list, dctx) -> None:
    raw, at = dctx.decompress(blob), 0
    kinds = {1: np.uint8, 2: np.uint16, 4: np.int32}
    for t, o, shape in zip(tgt, old, shapes):
        m, rs, cs = np.frombuffer(raw, dtype=np.int64, count=3, offset=at)
        at += 24
        rows = np.frombuffer(raw, dtype=kinds[int(rs)], count=int(m), offset=at).astype(np.int64)
        at += int(m * rs)
        d_cols = np.frombuffer(raw, dtype=kinds[int(cs)], count=int(m), offset=at).astype(np.int64)
        at += int(m * cs)
        vals = np.frombuffer(raw, dtype=np.int16, count=int(m), offset=at)
        at += int(m * 2)
        t.copy_(o)
        if not m:
            continue
        rows = np.cumsum(rows)
        start = np.ones(int(m), dtype=bool)
        start[1:] = rows[1:] != rows[:-1]
        run = np.cumsum(d_cols)  # column gaps summed within each row: subtract the sum before the row began
        base = (run - d_cols)[start]
        cols = run - base[np.cumsum(start) - 1]
        t[torch.from_numpy(rows * _cols(shape) + cols)] = torch.from_numpy(vals.copy())


def slime_encode(old: list, new: list, shapes: list, cctx) -> list:
    return [cctx.compress((o ^ n).numpy().tobytes()) for o, n in zip(old, new)]


def slime_decode(blob: list, tgt: list, old: list, shapes: list, dctx) -> None:
    for t, o, x in zip(tgt, old, blob):
        t.copy_(o)
        t.bitwise_xor_(torch.frombuffer(bytearray(dctx.decompress(x)), dtype=torch.int16))


def verl_encode(old: list, new: list, shapes: list, cctx) -> list:
    out = []
    for o, n in zip(old, new):
        idx = torch.ne(o, n).nonzero().squeeze(1)
        out.append((idx.to(torch.int32).numpy().tobytes(), n[idx].numpy().tobytes()))
    return out


def verl_decode(blob: list, tgt: list, old: list, shapes: list, dctx) -> None:
    for t, o, (ib, vb) in zip(tgt, old, blob):
        t.copy_(o)
        if ib:
            idx = torch.frombuffer(bytearray(ib), dtype=torch.int32).long()
            t[idx] = torch.frombuffer(bytearray(vb), dtype=torch.int16)


def nbytes(blob) -> int:
    if isinstance(blob, (bytes, bytearray)):
        return len(blob)
    return sum(nbytes(x) for x in blob)


CODECS = {"pulse": (pulse_encode, pulse_decode), "slime": (slime_encode, slime_decode),
          "verl": (verl_encode, verl_decode)}


def _h(counts: np.ndarray) -> float:
    """Shannon entropy in bits of an empirical distribution given by its counts."""
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum())


def _hb(c: np.ndarray, m: np.ndarray) -> float:
    """Bits to say which c of m elements changed, each independently with probability c/m (summed over rows)."""
    c, m = c[(c > 0) & (c < m)].astype(np.float64), m[(c > 0) & (c < m)].astype(np.float64)
    p = c / m
    return float(-(m * (p * np.log2(p) + (1 - p) * np.log2(1 - p))).sum())


def _h_given(key: np.ndarray, sym: np.ndarray) -> float:
    """sum over changed elements of -log2 P(sym | key), empirical: H(sym | key) times their count."""
    _, joint = np.unique(key.astype(np.int64) * (1 << 17) + (sym.astype(np.int64) + (1 << 16)), return_counts=True)
    _, marg = np.unique(key, return_counts=True)
    return _h(joint) * joint.sum() - _h(marg) * marg.sum()


def entropy_bound(old: list, new: list) -> dict:
    """Bytes per changed element below which no codec can go, under three models of a step's change, each with its
    distributions fitted to this very step (so the bound is optimistic for a real codec, which must learn them):
    `global`: every element changes independently with one probability, and a changed one moves by a step in
    bf16 bit patterns (new - old as integers) drawn from one distribution; `per_tensor`: the probability is each
    tensor's own; `given_old_exponent`: both the probability and the step's distribution depend on the old
    value's exponent, which the receiver holds (a small weight moves more often, by more patterns)."""
    n_all = np.zeros(256, dtype=np.int64)
    c_all = np.zeros(256, dtype=np.int64)
    c_t, m_t, steps, exps = [], [], [], []
    for o, n in zip(old, new):
        idx = torch.ne(o, n).nonzero().squeeze(1)
        e_o = ((o.to(torch.int32) >> 7) & 0xFF).numpy()
        n_all += np.bincount(e_o, minlength=256)
        c_t.append(idx.numel())
        m_t.append(o.numel())
        if idx.numel():
            e_c = e_o[idx.numpy()]
            c_all += np.bincount(e_c, minlength=256)
            exps.append(e_c)
            steps.append((n[idx].to(torch.int32) - o[idx].to(torch.int32)).numpy())
    changed = int(sum(c_t))
    if not changed:
        return {"changed": 0}
    step, exp = np.concatenate(steps), np.concatenate(exps)
    _, counts = np.unique(step, return_counts=True)
    val = _h(counts) + 0.0  # not -0.0 when every step is the same
    val_e = _h_given(exp, step) / changed
    pos = {"global": _hb(np.array([changed]), np.array([sum(m_t)])) / changed,
           "per_tensor": _hb(np.array(c_t), np.array(m_t)) / changed,
           "given_old_exponent": _hb(c_all, n_all) / changed}
    vals = {"global": val, "per_tensor": val, "given_old_exponent": val_e}
    return {"changed": changed, "position_bits_per_changed": pos, "value_bits_per_changed": vals,
            "bytes_per_changed": {m: (pos[m] + vals[m]) / 8 for m in pos}}
