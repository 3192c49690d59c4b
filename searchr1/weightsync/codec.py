"""Delta codec for bf16 weights: pure functions on tensors, no processes, no networking.

Wire format of one publication: a stream of frames. Each frame is one bucket of bytes plus an int64 header of
records; each record covers one window (a run of at most `window` elements) of one tensor:

    [tensor_id, kind, start, n, count, n_esc]      kind: DELTA, FULL or RICE (n_esc: its payload bytes)

A DELTA record's payload is `n_esc` int32 escapes, `count` bf16 values, `count` uint8 gaps (padded to 4 bytes).
Changes are found by comparing bits (int16 views), so -0.0 vs 0.0, NaN payloads and subnormals are all exact.
Positions are coded as gaps from the previous change (the first from start-1): a gap under 256 is one byte, a
larger one is a 0 byte plus an int32 escape, so indices cost ~1 byte instead of 4 at realistic sparsity. A window
never exceeds 2^31-1 elements, so escapes always fit int32 (parameters over 2^31 elements are chunked).
A FULL record's payload is the window's raw bf16 bits: chosen whenever the delta would be larger.
A RICE record (sync.codec=rice or rice_classes; rice.py describes it) codes gaps with Rice or Exp-Golomb codes
and values as bit-pattern differences Rice-coded in the context of the old value (rice_classes also codes
positions per class of old value): ~1-2 bytes per change instead of ~3. Its windows are smaller (`window_size`)
so that its encode scratch stays within one bucket. Receivers decode whatever kinds arrive.

The digest of a tensor is (sum u_i, sum u_i * i) over its uint16 bit patterns u_i, mod 2^64: it is additive over
windows (so the encoder computes it in the same pass as the compare), catches any single or pairwise corruption
for certain, and has an exact torch formula (the CUDA path).

CPU uses the C++ kernel of kernel.py (one pass: compare 32 elements per SIMD step, emit changes, update the published
copy, digest); CUDA and CPUs without a compiler use the torch path, which produces identical bytes.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence

import torch

from searchr1.weightsync import rice

log = logging.getLogger(__name__)

DELTA, FULL, RICE = 1, 2, 3
# sync.codec: gap8 sends DELTA records; rice and rice_classes send RICE records (rice_classes also codes
# positions per class of old values: fewer bytes, but a receiver reads every element of a window it applies)
FORMATS = ("gap8", "rice", "rice_classes")
REC = 6  # int64 fields per record
HEAD = 5  # [n_records, payload_bytes, last, n_tensors, digest_rows]
# Records per frame: bounds a receiver's header buffer; a 3B model's ~430 tensors fit one frame.
MAX_RECORDS = 1024
INDEX_LIMIT = 2**31 - 1
RICE_SCRATCH = 4  # rice encode scratch bytes per window element: the record (< 2) and its streams (< 2)


def kernel():
    """The C++ kernel, or None (imported on first use, so that `python -m searchr1.weightsync.kernel` runs
    the module once)."""
    from searchr1.weightsync import kernel as k

    return k.load()


def _use_kernel(t: torch.Tensor, impl: str) -> bool:
    if impl not in ("auto", "cpp", "torch"):
        raise ValueError(f"codec impl={impl!r}: must be auto, cpp or torch")
    if impl == "torch" or t.device.type != "cpu":
        if impl == "cpp":
            raise ValueError(f"codec impl=cpp needs CPU tensors, got {t.device}")
        return False
    if kernel() is None:
        if impl == "cpp":
            raise RuntimeError("codec impl=cpp but the C++ kernel failed to build (see the log)")
        return False
    return True


def bits(t: torch.Tensor) -> torch.Tensor:
    """The flat int16 view of a contiguous bf16 tensor (the unit every codec function works on)."""
    if t.dtype != torch.bfloat16:
        raise TypeError(f"expected a bfloat16 tensor, got {t.dtype}")
    if not t.is_contiguous():
        raise ValueError("expected a contiguous tensor (the codec writes in place through a flat view)")
    return t.view(-1).view(torch.int16)


def digest(x_n: torch.Tensor, offset: int = 0, impl: str = "auto") -> tuple[int, int]:
    """(sum u_i, sum u_i*(offset+i)) mod 2^64 as signed int64, over the uint16 bits u of the int16 view `x_n`."""
    if _use_kernel(x_n, impl):
        s0, s1 = kernel().digest(x_n, offset)
        return int(s0), int(s1)
    # Same block decomposition as the kernel: per 256-element block, sum u and sum u*j (j in-block) fit int32;
    # only the per-block terms need int64.
    n = x_n.numel()
    full = n // 256 * 256
    u_bj = (x_n[:full].view(-1, 256).to(torch.int32) & 0xFFFF)
    j_j = torch.arange(256, dtype=torch.int32, device=x_n.device)
    bs_b = u_bj.sum(1, dtype=torch.int32).to(torch.int64)
    bw_b = (u_bj * j_j).sum(1, dtype=torch.int32).to(torch.int64)
    base_b = torch.arange(bs_b.numel(), dtype=torch.int64, device=x_n.device) * 256 + offset
    s0, s1 = bs_b.sum(), (base_b * bs_b + bw_b).sum()
    if full < n:
        u_r = x_n[full:].to(torch.int64) & 0xFFFF
        s0 = s0 + u_r.sum()
        s1 = s1 + (u_r * torch.arange(offset + full, offset + n, dtype=torch.int64, device=x_n.device)).sum()
    return int(s0), int(s1)


def add_digest(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """Digests of disjoint windows add (mod 2^64, kept as signed int64)."""
    return tuple(((x + y + 2**63) % 2**64) - 2**63 for x, y in zip(a, b))


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"codec format {fmt!r}: must be one of {list(FORMATS)}")


@dataclass
class Scratch:
    """Reusable encode buffers for windows of up to `window` elements on one device, for format `fmt`."""

    window: int
    device: torch.device
    fmt: str = "gap8"
    gaps_w: torch.Tensor = field(init=False)
    esc_w: torch.Tensor = field(init=False)
    vals_w: torch.Tensor = field(init=False)

    def __post_init__(self):
        if not 0 < self.window <= INDEX_LIMIT:
            raise ValueError(f"window={self.window}: must be in [1, {INDEX_LIMIT}]")
        _check_format(self.fmt)
        dev, w = self.device, self.window
        if self.fmt == "gap8":
            self.gaps_w = torch.empty(w, dtype=torch.uint8, device=dev)
            self.esc_w = torch.empty(w // 256 + 1, dtype=torch.int32, device=dev)
            self.vals_w = torch.empty(w, dtype=torch.int16, device=dev)
        elif torch.device(dev).type == "cpu":  # the C++ path's record; the torch path allocates its own
            self.words_w = torch.empty(w // 2 + 1, dtype=torch.int32)


@dataclass
class WindowDelta:
    count: int
    n_esc: int
    gaps: torch.Tensor  # uint8 [count]
    esc: torch.Tensor  # int32 [n_esc]
    vals: torch.Tensor  # int16 [count]
    digest: tuple[int, int]  # of the new window

    @property
    def nbytes(self) -> int:
        return _pad4(4 * self.n_esc + 3 * self.count)


def _pad4(n: int) -> int:
    return (n + 3) & ~3


@dataclass
class RiceWindow:
    count: int
    words: Optional[torch.Tensor]  # int32 payload; None when not smaller than the window sent whole
    digest: tuple[int, int]  # of the new window

    @property
    def nbytes(self) -> int:
        return 4 * self.words.numel() if self.words is not None else 1 << 62


def encode_window(new_n: torch.Tensor, pub_n: torch.Tensor, scratch: Scratch, offset: int = 0,
                  impl: str = "auto") -> WindowDelta:
    """Changes of `new_n` against `pub_n` (int16 views of one window); `pub_n` becomes `new_n` (it is the
    publisher's copy of what receivers hold). `offset`: the window's start in its tensor, for the digest."""
    n = new_n.numel()
    if pub_n.numel() != n or n > scratch.window:
        raise ValueError(f"window of {n} elements: published has {pub_n.numel()}, scratch holds {scratch.window}")
    if _use_kernel(new_n, impl):
        count, n_esc, s0, s1 = kernel().encode_window(new_n, pub_n, scratch.gaps_w, scratch.esc_w,
                                                      scratch.vals_w, offset)
        return WindowDelta(count, n_esc, scratch.gaps_w[:count], scratch.esc_w[:n_esc], scratch.vals_w[:count],
                           (s0, s1))
    dig = digest(new_n, offset, impl="torch")
    idx_c = torch.ne(new_n, pub_n).nonzero().squeeze(1)
    count = idx_c.numel()
    vals_c = scratch.vals_w[:count]
    torch.index_select(new_n, 0, idx_c, out=vals_c)
    pub_n.index_put_((idx_c,), vals_c)
    gap_c = torch.diff(idx_c, prepend=idx_c.new_full((1,), -1))
    big_c = gap_c > 255
    esc = gap_c[big_c]
    n_esc = esc.numel()
    scratch.esc_w[:n_esc].copy_(esc)
    scratch.gaps_w[:count].copy_(gap_c.masked_fill_(big_c, 0))
    return WindowDelta(count, n_esc, scratch.gaps_w[:count], scratch.esc_w[:n_esc], vals_c, dig)


def apply_window(dst_n: torch.Tensor, gaps: torch.Tensor, esc: torch.Tensor, vals: torch.Tensor,
                 impl: str = "auto") -> None:
    """Overwrite the changed elements of the int16 window `dst_n` in place (never adds)."""
    if _use_kernel(dst_n, impl):
        kernel().apply_window(dst_n, gaps, esc, vals)
        # Raw pointer writes leave the autograd version counter alone; an empty in-place op bumps it, as any
        # torch write would, so that engines watching it (vLLM's prefix cache) see the update.
        dst_n[:0].zero_()
        return
    if gaps.numel() != vals.numel():
        raise ValueError(f"record has {gaps.numel()} gaps but {vals.numel()} values")
    step_c = gaps.to(torch.int64)
    hole_c = step_c == 0
    if int(hole_c.sum()) != esc.numel():
        raise ValueError(f"record carries {esc.numel()} escapes but uses {int(hole_c.sum())}")
    step_c[hole_c] = esc.to(torch.int64)
    idx_c = torch.cumsum(step_c, 0) - 1
    if idx_c.numel() and (int(idx_c[-1]) >= dst_n.numel() or bool((step_c <= 0).any())):
        raise ValueError(f"change indices out of order or outside the window of {dst_n.numel()} elements")
    dst_n.index_put_((idx_c,), vals)


def encode_window_rice(new_n: torch.Tensor, pub_n: torch.Tensor, scratch: Optional[Scratch], offset: int = 0,
                       impl: str = "auto", classes: bool = False) -> RiceWindow:
    """The RICE record of `new_n` against `pub_n` (int16 views of one window); `pub_n` becomes `new_n`.
    `classes`: may code positions per class of old values (rice_classes)."""
    n = new_n.numel()
    if pub_n.numel() != n:
        raise ValueError(f"window of {n} elements: published has {pub_n.numel()}")
    max_words = max(0, full_window_nbytes(n) // 4 - 1)  # strictly smaller than sending the window whole
    if _use_kernel(new_n, impl):
        if scratch is None or scratch.fmt == "gap8" or n > scratch.window:
            raise ValueError(f"rice encoding of {n} elements needs a rice scratch of at least that window")
        count, used, s0, s1, _ = kernel().rice_encode(new_n, pub_n, scratch.words_w[:max_words], offset, classes)
        return RiceWindow(count, scratch.words_w[:used] if count and used > 0 else None, (s0, s1))
    dig = digest(new_n, offset, impl="torch")
    count, words = rice.encode(new_n, pub_n, max_words, classes)
    return RiceWindow(count, words, dig)


def apply_rice(dst_n: torch.Tensor, words: torch.Tensor, count: int, impl: str = "auto") -> bool:
    """Decode a RICE record into the int16 window `dst_n` in place. False: it did not decode consistently with
    dst's values (this receiver does not hold the published copy); the digest check then repairs the tensor."""
    if _use_kernel(dst_n, impl):
        ok = kernel().rice_apply(dst_n, words, count) == 0
        dst_n[:0].zero_()  # bump the version counter, as apply_window does
        return ok
    return rice.apply(dst_n, words, count)


def windows(numel: int, window: int) -> Iterator[tuple[int, int]]:
    """(start, n) of each window of a tensor with `numel` elements (one empty window for an empty tensor)."""
    if numel == 0:
        yield 0, 0
    for start in range(0, numel, window):
        yield start, min(window, numel - start)


def _bytes(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.uint8)


class FrameWriter:
    """Packs records into one bucket of `capacity` bytes; `header()` describes the bucket's contents."""

    def __init__(self, capacity: int, device: torch.device):
        self.capacity = capacity
        self.bucket = torch.empty(capacity, dtype=torch.uint8, device=device)
        self.records: list[list[int]] = []
        self.used = 0

    def fits(self, nbytes: int) -> bool:
        return len(self.records) < MAX_RECORDS and self.used + nbytes <= self.capacity

    def add_delta(self, tid: int, start: int, n: int, wd: WindowDelta) -> None:
        o = self.used
        _bytes(self.bucket[o:o + 4 * wd.n_esc]).copy_(_bytes(wd.esc))
        o += 4 * wd.n_esc
        self.bucket[o:o + 2 * wd.count].view(torch.int16).copy_(wd.vals)
        o += 2 * wd.count
        self.bucket[o:o + wd.count].copy_(wd.gaps)
        self.bucket[o + wd.count:self.used + wd.nbytes].zero_()  # padding: the same bytes on every send
        self.records.append([tid, DELTA, start, n, wd.count, wd.n_esc])
        self.used += wd.nbytes

    def add_rice(self, tid: int, start: int, n: int, rw: RiceWindow) -> None:
        size = rw.nbytes
        self.bucket[self.used:self.used + size].view(torch.int32).copy_(rw.words)
        self.records.append([tid, RICE, start, n, rw.count, size])
        self.used += size

    def add_full(self, tid: int, start: int, src_n: torch.Tensor) -> None:
        n = src_n.numel()
        self.bucket[self.used:self.used + 2 * n].view(torch.int16).copy_(src_n)
        self.bucket[self.used + 2 * n:self.used + _pad4(2 * n)].zero_()
        self.records.append([tid, FULL, start, n, n, 0])
        self.used += _pad4(2 * n)

    def header(self, last: bool, n_tensors: int, digests=None) -> torch.Tensor:
        """HEAD, the records, then (the last frame of a verified publication) [kind, s0, s1] per tensor:
        O(records + tensors) int64s, and the digests (a stream.StreamStats) travel without a broadcast of their own."""
        flat = [v for rec in self.records for v in rec]
        rows = [] if digests is None else [v for k, d in zip(digests.kind, digests.digest) for v in (k, *d)]
        return torch.tensor([len(self.records), self.used, int(last), n_tensors, len(rows) // 3] + flat + rows,
                            dtype=torch.int64)

    def reset(self) -> None:
        self.records, self.used = [], 0


def full_window_nbytes(n: int) -> int:
    return _pad4(2 * n)


def parse_header(h: torch.Tensor) -> tuple[list[list[int]], int, bool, int]:
    """(records, payload_bytes, last, n_tensors) from a frame header (on any device)."""
    h = h.cpu()
    n_rec, used, last, n_tensors = (int(v) for v in h[:HEAD - 1])
    if not 0 <= n_rec <= MAX_RECORDS:
        raise ValueError(f"frame header names {n_rec} records (at most {MAX_RECORDS})")
    recs = h[HEAD:HEAD + REC * n_rec].view(n_rec, REC).tolist()
    return recs, used, bool(last), n_tensors


def parse_digests(h: torch.Tensor) -> Optional[torch.Tensor]:
    """The [kind, s0, s1] rows a frame header carries (CPU int64 [n_tensors, 3]), or None."""
    h = h.cpu()
    n_rec, n_dig = int(h[0]), int(h[4])
    if not n_dig:
        return None
    return h[HEAD + REC * n_rec:HEAD + REC * n_rec + 3 * n_dig].view(n_dig, 3)


def apply_frame(records: Sequence[Sequence[int]], payload: torch.Tensor, targets: Sequence[torch.Tensor],
                impl: str = "auto", names: Optional[Sequence[str]] = None) -> dict[int, int]:
    """Write a frame's records into `targets` (flat int16 views, indexed by tensor id). Returns the changed
    element count per tensor id that the frame touched."""
    touched: dict[int, int] = {}
    inconsistent: list[str] = []
    o = 0
    for tid, kind, start, n, count, n_esc in records:
        label = names[tid] if names is not None and 0 <= tid < len(names) else f"tensor id {tid}"
        if not 0 <= tid < len(targets):
            raise ValueError(f"record names tensor id {tid}; the receiver holds {len(targets)} tensors")
        dst = targets[tid]
        if start < 0 or n < 0 or start + n > dst.numel():
            raise ValueError(f"record for {label}: window [{start}, {start + n}) outside its {dst.numel()} elements")
        win = dst[start:start + n]
        if kind == FULL:
            size = full_window_nbytes(n)
            if o + size > payload.numel():
                raise ValueError(f"record for {label} runs past the {payload.numel()}-byte payload")
            win.copy_(payload[o:o + 2 * n].view(torch.int16))
        elif kind == DELTA:
            size = _pad4(4 * n_esc + 3 * count)
            if count < 0 or n_esc < 0 or count > n or o + size > payload.numel():
                raise ValueError(f"record for {label}: count={count}, n_esc={n_esc} do not fit the window or payload")
            esc = payload[o:o + 4 * n_esc].view(torch.int32)
            vals = payload[o + 4 * n_esc:o + 4 * n_esc + 2 * count].view(torch.int16)
            gaps = payload[o + 4 * n_esc + 2 * count:o + 4 * n_esc + 3 * count]
            apply_window(win, gaps, esc, vals, impl)
        elif kind == RICE:
            size = n_esc
            if size < 4 * rice.HEAD or size % 4 or count < 0 or count > n or o + size > payload.numel():
                raise ValueError(f"record for {label}: count={count}, bytes={size} do not fit the window or payload")
            if not apply_rice(win, payload[o:o + size].view(torch.int32), count, impl):
                inconsistent.append(label)
        else:
            raise ValueError(f"record for {label} has unknown kind {kind}")
        touched[tid] = touched.get(tid, 0) + count
        o += size
    if inconsistent:
        log.warning("rice records for %s did not decode consistently with this receiver's weights (it does not "
                    "hold the published copy); the digest check flags them", sorted(set(inconsistent))[:5])
    return touched


def window_size(bucket_bytes: int, fmt: str = "gap8") -> int:
    """Largest window whose record always fits an empty bucket: a delta is only sent when not larger than the
    full window (2 bytes per element). rice: also small enough that its encode scratch fits one bucket."""
    _check_format(fmt)
    w = max(1, min(INDEX_LIMIT, (bucket_bytes - 4) // 2))
    return w if fmt == "gap8" else max(1, min(w, bucket_bytes // RICE_SCRATCH))
