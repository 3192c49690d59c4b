"""Weight publication over torch.distributed: trainer rank 0 (group rank 0) broadcasts to every rollout rank.

One publication, every member of the sync group taking part collectively:
 1. all_reduce MAX of [resync, version]: any receiver that is new or lost sync (or a publisher whose tensor set
    changed) turns the publication into a full export, preceded by the name table (JSON of names and numels).
 2. frames: int64 [n_records, payload_bytes, last, n_tensors], the records (6 int64 each), then the bucket's
    used bytes (uint8: gloo has no int16), until `last`.
 3. with cfg.verify: the last frame's header carries [kind, s0, s1] per tensor; each receiver recomputes the
    digest of every updated tensor; all_reduce MAX of the mismatch flags; flagged tensors are resent whole in the same
    publication and checked again; a second failure raises on every rank.
 4. all_reduce MAX of the receivers' apply/verify seconds, so the publisher's metrics cover the slowest rank.
The same code runs on gloo (CPU tensors) and NCCL (CUDA tensors): only `device` differs. The same frames can
also go to a file instead of a group (`FileWire`: the elastic rollouts' channel), with the rounds of 1, 3 and 4
reduced to what one writer and later readers can do.
Memory beyond the weights: one bucket (sync.bucket_mb) per rank, plus on the publisher the encode scratch for
one window (~1.5 buckets) and the published bf16 copy that deltas are taken against (sync=delta only).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.distributed as dist

from searchr1.config import SyncConfig
from searchr1.weightsync import codec, stream


class SyncError(RuntimeError):
    """A publication that could not make every receiver bit-exact."""


class GroupWire:
    """A publication over a process group: the publisher broadcasts, receivers fill; control, mismatch and
    timing rounds are all-reduces (MAX) over every member."""

    def __init__(self, group):
        self.group = group

    def bcast(self, t: torch.Tensor) -> None:
        dist.broadcast(t, group=self.group, group_src=0)

    def control(self, t: torch.Tensor) -> None:
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)

    agree = control


class FileWire:
    """A publication as a file (elastic rollouts, searchr1/weightsync/files.py): the publisher writes what it
    would broadcast, a receiver reads it back in the same order. No round trips: the publisher's control values
    are the file's, and a receiver that finds a mismatch cannot ask for a resend (it resyncs from a full one)."""

    def __init__(self, f, writing: bool):
        self.f, self.writing = f, writing

    def bcast(self, t: torch.Tensor) -> None:
        if self.writing:
            self.f.write(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
            return
        n = t.numel() * t.element_size()
        data = self.f.read(n)
        if len(data) != n:
            raise SyncError(f"{getattr(self.f, 'name', 'publication file')}: truncated ({len(data)} of {n} bytes)")
        t.copy_(torch.frombuffer(bytearray(data), dtype=t.dtype).reshape(t.shape))

    control = bcast

    def agree(self, t: torch.Tensor) -> None:
        pass


class _Endpoint:
    def __init__(self, group, cfg: SyncConfig, device, impl: str = "auto"):
        """`group`: a process group (the fixed world), or a wire (GroupWire, FileWire)."""
        self.wire = group if isinstance(group, (GroupWire, FileWire)) else GroupWire(group)
        self.cfg, self.device, self.impl = cfg, torch.device(device), impl
        self.capacity = cfg.bucket_mb << 20
        self.head = torch.empty(codec.HEAD, dtype=torch.int64, device=self.device)

    def _control(self, resync: int, version: int) -> tuple[bool, int]:
        t = torch.tensor([resync, version], dtype=torch.int64, device=self.device)
        self.wire.control(t)
        return bool(t[0]), int(t[1])

    def _mismatch_round(self, flags: torch.Tensor) -> list[int]:
        self.wire.agree(flags)
        return flags.nonzero().flatten().tolist()

    def _times_round(self, apply_s: float, verify_s: float) -> tuple[float, float]:
        t = torch.tensor([apply_s, verify_s], dtype=torch.float32, device=self.device)
        self.wire.agree(t)
        return float(t[0]), float(t[1])


class Publisher(_Endpoint):
    """Trainer rank 0's side. Owns the last published bf16 copy (the reference every delta is taken against)."""

    def __init__(self, group, cfg: SyncConfig, device, impl: str = "auto"):
        super().__init__(group, cfg, device, impl)
        self.writer = codec.FrameWriter(self.capacity, self.device)
        self.scratch: Optional[codec.Scratch] = None
        self.table: Optional[list[tuple[str, int]]] = None
        self.published: Optional[list[torch.Tensor]] = None

    def publish(self, weights: dict[str, torch.Tensor], version: int, full: bool = False) -> dict[str, float]:
        """Publish `weights` as `version`: a delta against the last publication, or everything when `full`,
        when the tensor set changed, or when a receiver asks (it is new or lost sync)."""
        names = list(weights)
        new = [codec.bits(weights[k]) for k in names]
        table = [(k, t.numel()) for k, t in zip(names, new)]
        resync, version = self._control(int(full or table != self.table), version)
        m = {"sync/version": float(version), "sync/bytes": 0.0, "sync/encode_s": 0.0, "sync/transfer_s": 0.0,
             "sync/frames": 0.0}
        if resync:
            self._send_table(table, m)
        delta = self.cfg.method == "delta"
        if delta and (self.published is None or table != self.table):
            self.published = [torch.empty_like(t) for t in new]
        elif not delta:
            self.published = None
        self.table = table
        everything = list(range(len(new)))
        full_ids = set(everything) if resync or not delta else set()
        stats = stream.StreamStats.empty(len(new))
        self._send_stream(new, full_ids, everything, stats, m, with_digests=self.cfg.verify)

        mismatched, repaired = 0, 0
        if self.cfg.verify:
            bad = self._mismatch_round(torch.zeros(len(new), dtype=torch.int32, device=self.device))
            mismatched = len(bad)
            if bad:
                repair = stream.StreamStats.empty(len(new))
                self._send_stream(new, set(bad), bad, repair, m)
                still = self._mismatch_round(torch.zeros(len(new), dtype=torch.int32, device=self.device))
                if still:
                    raise SyncError(f"weights still differ after a full resend: {[names[i] for i in still]}")
                repaired = len(bad)
        apply_s, verify_s = self._times_round(0.0, 0.0)
        total = sum(n for _, n in table)
        changed = sum(stats.count)
        m.update({
            "sync/full": float(bool(full_ids) and len(full_ids) == len(new)),
            "sync/changed": float(changed),
            "sync/changed_frac": changed / max(total, 1),
            "sync/full_bytes": 2.0 * total,
            "sync/tensors_delta": float(sum(k == codec.DELTA for k in stats.kind)),
            "sync/tensors_full": float(sum(k == codec.FULL for k in stats.kind)),
            "sync/apply_s": apply_s,
            "sync/verify_s": verify_s,
            "sync/verified": 1.0 if self.cfg.verify else math.nan,  # a failure raises instead
            "sync/mismatched": float(mismatched),
            "sync/repaired": float(repaired),
        })
        m["sync/bytes_frac"] = m["sync/bytes"] / max(m["sync/full_bytes"], 1.0)
        return m

    def _send(self, t: torch.Tensor, m: dict) -> None:
        t0 = time.perf_counter()
        self.wire.bcast(t)
        m["sync/transfer_s"] += time.perf_counter() - t0
        m["sync/bytes"] += t.numel() * t.element_size()

    def _send_table(self, table, m: dict) -> None:
        blob = torch.frombuffer(bytearray(json.dumps(table).encode()), dtype=torch.uint8)
        self._send(torch.tensor([blob.numel()], dtype=torch.int64, device=self.device), m)
        self._send(blob.to(self.device), m)

    def _send_stream(self, new, full_ids, ids, stats, m: dict, with_digests: bool = False) -> None:
        window = codec.window_size(self.capacity, self.cfg.codec)
        if len(full_ids) < len(ids) and self.scratch is None:
            self.scratch = codec.Scratch(window, self.device, self.cfg.codec)
        frames = stream.encode_stream(new, self.published, ids, full_ids, self.writer, window, self.scratch, stats,
                                      self.impl, self.cfg.codec)
        while True:
            t0 = time.perf_counter()
            last = next(frames)
            m["sync/encode_s"] += time.perf_counter() - t0
            header = self.writer.header(last, len(new), stats if last and with_digests else None).to(self.device)
            self._send(header[:codec.HEAD], m)
            if header.numel() > codec.HEAD:
                self._send(header[codec.HEAD:], m)
            if self.writer.used:
                self._send(self.writer.bucket[:self.writer.used], m)
            m["sync/frames"] += 1
            self.writer.reset()
            if last:
                break


@dataclass
class Publication:
    """One publication as received, kept to be replayed later onto other tensors holding the previous version
    (a staging copy receives while the engine generates; the engine takes the version at a safe point)."""

    version: int
    names: list[str]
    frames: list[tuple[list[list[int]], torch.Tensor]] = field(default_factory=list)  # (records, payload bytes)
    digests: Optional[torch.Tensor] = None  # [kind, s0, s1] per tensor, as published


def replay(pub: Publication, views: dict[str, torch.Tensor], impl: str = "auto") -> int:
    """Write `pub` into `views` (which hold the version before it) and check every tensor it updated against
    the published digest; returns the elements changed. A mismatch is not repaired here (the publisher has
    moved on): the views were written by someone else, and that is an error."""
    targets = [codec.bits(views[k]) for k in pub.names]
    changed = 0
    for records, payload in pub.frames:
        changed += sum(codec.apply_frame(records, payload, targets, impl, pub.names).values())
    if pub.digests is not None:
        bad = [pub.names[t] for t in range(len(targets)) if pub.digests[t, 0] != 0
               and codec.digest(targets[t], 0, impl) != (int(pub.digests[t, 1]), int(pub.digests[t, 2]))]
        if bad:
            raise SyncError(f"version {pub.version}: {bad[:5]} differ from the publication after replay")
    return changed


class Subscriber(_Endpoint):
    """A rollout rank's side: writes into the engine's live bf16 tensors in place and checks their digests."""

    def __init__(self, group, cfg: SyncConfig, device, impl: str = "auto"):
        super().__init__(group, cfg, device, impl)
        self.bucket = torch.empty(self.capacity, dtype=torch.uint8, device=self.device)
        self.names: Optional[list[str]] = None
        self.synced = False
        self._keep: Optional[Publication] = None

    def receive(self, views: dict[str, torch.Tensor], keep: Optional[Publication] = None) -> dict[str, float]:
        """Receive one publication into `views`; with `keep`, also record its frames and digests there."""
        self._keep = keep
        try:
            return self._receive(views)
        except Exception:
            self.synced = False
            raise
        finally:
            self._keep = None

    def _receive(self, views: dict[str, torch.Tensor]) -> dict[str, float]:
        t_start = time.perf_counter()
        resync, version = self._control(int(not self.synced), 0)
        m = {"sync/version": float(version), "sync/apply_s": 0.0, "sync/verify_s": 0.0, "sync/bytes": 0.0}
        if resync:
            self.names = self._recv_table(views)
        if self.names is None:
            raise SyncError("received a delta before any full export")
        targets = [self._target(views, k) for k in self.names]
        changed, dig = self._recv_stream(targets, m)
        if self._keep is not None:
            self._keep.version, self._keep.names, self._keep.digests = version, list(self.names), dig

        mismatched, repaired = 0, 0
        if self.cfg.verify:
            if dig is None:
                raise SyncError("sync.verify is on here but the publisher sent no digests (configs differ)")
            updated = [t for t in range(len(targets)) if dig[t, 0] != 0]
            own, bad = self._check(targets, dig, updated, m)
            mismatched = len(own)  # this rank's; the publisher reports the group's
            if bad:
                self._recv_stream(targets, m)  # the flagged tensors, whole
                _, still = self._check(targets, dig, bad, m)
                if still:
                    raise SyncError(f"weights still differ after a full resend: {[self.names[i] for i in still]}")
                repaired = len(own)
        apply_s, verify_s = m["sync/apply_s"], m["sync/verify_s"]
        self._times_round(apply_s, verify_s)
        self.synced = True
        m.update({"sync/full": float(resync), "sync/changed": float(sum(changed.values())),
                  "sync/mismatched": float(mismatched), "sync/repaired": float(repaired),
                  "sync/verified": 1.0 if self.cfg.verify else math.nan,
                  "sync/transfer_s": time.perf_counter() - t_start - apply_s - verify_s})
        return m

    def _recv_table(self, views) -> list[str]:
        n = torch.empty(1, dtype=torch.int64, device=self.device)
        self.wire.bcast(n)
        blob = torch.empty(int(n), dtype=torch.uint8, device=self.device)
        self.wire.bcast(blob)
        table = json.loads(bytes(blob.cpu().numpy()).decode())
        for name, numel in table:
            if name not in views:
                raise KeyError(f"the trainer publishes {name!r}, which the engine's weight views lack")
            if views[name].numel() != numel:
                raise ValueError(f"{name}: the trainer's tensor has {numel} elements, the engine's "
                                 f"{views[name].numel()} (shape {tuple(views[name].shape)})")
        return [name for name, _ in table]

    def _target(self, views, name: str) -> torch.Tensor:
        if name not in views:
            raise KeyError(f"weight view {name!r} disappeared from the engine since the last full export")
        v = views[name]
        if v.device != self.device:
            raise ValueError(f"{name} lives on {v.device}, the sync group on {self.device}")
        return codec.bits(v)

    def _recv_stream(self, targets, m: dict) -> tuple[dict[int, int], Optional[torch.Tensor]]:
        """Frames until the last; (changed elements per tensor id, the digest rows if the last frame had them)."""
        changed: dict[int, int] = {}
        while True:
            self.wire.bcast(self.head)
            n_rec, n_dig = int(self.head[0]), int(self.head[4])
            if not 0 <= n_rec <= codec.MAX_RECORDS or n_dig not in (0, len(targets)):
                raise SyncError(f"frame header announces {n_rec} records (at most {codec.MAX_RECORDS}) and "
                                f"{n_dig} digests for {len(targets)} tensors")
            rest = torch.empty(codec.REC * n_rec + 3 * n_dig, dtype=torch.int64, device=self.device)
            if rest.numel():
                self.wire.bcast(rest)
            header = torch.cat([self.head, rest]).cpu()
            records, used, last, n_tensors = codec.parse_header(header)
            if n_tensors != len(targets):
                raise SyncError(f"frame for {n_tensors} tensors, this receiver holds {len(targets)}")
            if used > self.capacity:
                raise SyncError(f"frame of {used} bytes exceeds sync.bucket_mb={self.cfg.bucket_mb} here")
            if used:
                self.wire.bcast(self.bucket[:used])
            if self._keep is not None:
                self._keep.frames.append((records, self.bucket[:used].clone()))
            m["sync/bytes"] += used
            t0 = time.perf_counter()
            for t, c in codec.apply_frame(records, self.bucket[:used], targets, self.impl, self.names).items():
                changed[t] = changed.get(t, 0) + c
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            m["sync/apply_s"] += time.perf_counter() - t0
            if last:
                return changed, codec.parse_digests(header)

    def _check(self, targets, dig: torch.Tensor, ids: list[int], m: dict) -> tuple[list[int], list[int]]:
        """(this rank's mismatched tensor ids, every rank's)."""
        t0 = time.perf_counter()
        flags = torch.zeros(len(targets), dtype=torch.int32)
        for t in ids:
            if codec.digest(targets[t], 0, self.impl) != (int(dig[t, 1]), int(dig[t, 2])):
                flags[t] = 1
        m["sync/verify_s"] += time.perf_counter() - t0
        return flags.nonzero().flatten().tolist(), self._mismatch_round(flags.to(self.device))
