"""A publication's tensors into frames: each tensor whole or as per-window deltas (whichever is smaller), in
the chosen record format, cut wherever the bucket is full; the publisher's copy ends equal to the new weights."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import torch

from searchr1.weightsync import codec


@dataclass
class StreamStats:
    """Per tensor of one publication: changed elements, kind (0: unchanged, DELTA, FULL), digest of the new tensor."""

    count: list[int]
    kind: list[int]
    digest: list[tuple[int, int]]

    @classmethod
    def empty(cls, n: int) -> "StreamStats":
        return cls([0] * n, [0] * n, [(0, 0)] * n)

    def updated(self) -> list[int]:
        return [t for t, k in enumerate(self.kind) if k]


def encode_stream(new: Sequence[torch.Tensor], pub: Optional[Sequence[torch.Tensor]], ids: Sequence[int],
                  full_ids: set[int], writer: codec.FrameWriter, window: int, scratch: Optional[codec.Scratch],
                  stats: StreamStats, impl: str = "auto", fmt: str = "gap8") -> Iterator[bool]:
    """Encode the tensors `ids` of `new` (flat int16 views) into `writer`, yielding whenever its bucket must go
    out: False while more follows, True for the last frame; the caller sends the frame and resets the writer.
    Ids in `full_ids` go whole; the others as deltas (DELTA records for fmt=gap8, RICE for fmt=rice) against
    `pub`, or whole per window where the delta would be larger. `pub` (None: the caller keeps no published copy,
    so everything goes whole) ends equal to `new`; `stats` is filled in for `ids` (kind DELTA: sent as changes,
    in either format)."""
    codec._check_format(fmt)
    if fmt == "gap8":
        encode = codec.encode_window
    else:
        def encode(new_w, pub_w, scratch, start, impl):
            return codec.encode_window_rice(new_w, pub_w, scratch, start, impl, classes=fmt == "rice_classes")
    for tid in ids:
        new_n = new[tid]
        whole = tid in full_ids or pub is None
        if not whole and (scratch is None or scratch.window < window or scratch.fmt != fmt):
            raise ValueError(f"{fmt} delta encoding needs a {fmt} scratch of at least {window} elements")
        pub_n = None if pub is None else pub[tid]
        if whole:
            stats.kind[tid] = codec.FULL
        for start, n in codec.windows(new_n.numel(), window):
            new_w = new_n[start:start + n]
            if whole:
                if pub_n is not None:
                    pub_n[start:start + n].copy_(new_w)
                wd, dig, changed, size = None, codec.digest(new_w, start, impl), n, codec.full_window_nbytes(n)
            else:
                wd = encode(new_w, pub_n[start:start + n], scratch, start, impl)
                dig, changed, size = wd.digest, wd.count, wd.nbytes
                stats.digest[tid] = codec.add_digest(stats.digest[tid], dig)
                if changed == 0:
                    continue
                if size >= codec.full_window_nbytes(n):
                    wd, size = None, codec.full_window_nbytes(n)
                stats.kind[tid] = stats.kind[tid] or codec.DELTA
            if whole:
                stats.digest[tid] = codec.add_digest(stats.digest[tid], dig)
            if not writer.fits(size):
                yield False
                writer.reset()
            if wd is None:
                writer.add_full(tid, start, new_w)
            elif fmt == "gap8":
                writer.add_delta(tid, start, n, wd)
            else:
                writer.add_rice(tid, start, n, wd)
            stats.count[tid] += changed
    yield True
