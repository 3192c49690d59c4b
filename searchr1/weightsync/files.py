"""Weights as files in the run folder: the channel of elastic rollouts (searchr1/roles/elastic.py).

NCCL and gloo groups cannot grow, and a member that dies takes the group with it, so rollout workers that come
and go mid-run cannot be in the broadcast. Trainer rank 0 writes each publication instead (the very frames and
digests the broadcast would carry, through `FileWire`) into run_dir/weights/, atomically (a temporary file
renamed into place), and announces its version on the store once the file is there; a worker reads the files
it needs:

    weights/current              the folder of the publisher now running (replaced once its first file exists)
    weights/i<id>/v000010.full   every tensor: where a worker joins (a new one, a restarted one, or one that
                                 lost sync)
    weights/i<id>/v000011.delta  only the elements that changed since v000010

Each publisher (each incarnation of trainer rank 0: a requeued job, a resume from an older checkpoint) writes
into a folder of its own, one file per version, and deletes the folders of earlier incarnations once its first
full file is in place: files of two runs that share version numbers can never be mixed, and a worker that
held weights of an earlier incarnation rejoins from the new one's full file.

A full publication every `full_every` versions bounds what a joiner replays; files older than the
second-newest full one are deleted. The bytes per step are those of the broadcast (each worker reads them once
from the shared file system), and every publication is verified by its digests like the broadcast's.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import time
from pathlib import Path

import torch

from searchr1.config import SyncConfig
from searchr1.rundir import write_atomic
from searchr1.weightsync.transport import FileWire, Publisher, Subscriber, SyncError

log = logging.getLogger(__name__)
_NAME = re.compile(r"v(\d{6})\.(full|delta)$")
POINTER = "current"


def publications(folder: Path) -> list[tuple[int, str, Path]]:
    """(version, kind, path) of every complete publication file, oldest first."""
    out = []
    for p in Path(folder).glob("v*"):
        m = _NAME.fullmatch(p.name)
        if m:
            out.append((int(m[1]), m[2], p))
    return sorted(out)


class FilePublisher:
    announce_after = True  # WeightsOut announces a version only once its file exists

    def __init__(self, run_dir: Path, cfg: SyncConfig, full_every: int, device="cpu"):
        self.root = Path(run_dir) / "weights"
        self.root.mkdir(parents=True, exist_ok=True)
        self.folder = self.root / f"i{time.time_ns():x}-{os.getpid()}"
        self.folder.mkdir()
        self.publisher = Publisher(FileWire(None, True), cfg, device)
        self.full_every, self.first = full_every, None

    def publish(self, weights: dict[str, torch.Tensor], version: int) -> dict[str, float]:
        if self.first is None:
            self.first = version
        full = (version - self.first) % self.full_every == 0
        path = self.folder / f"v{version:06d}.{'full' if full else 'delta'}"
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            self.publisher.wire = FileWire(f, True)
            m = self.publisher.publish(weights, version, full=full)
        os.replace(tmp, path)  # a reader never sees half a publication
        if version == self.first:
            self._take_over()
        self._prune()
        return m

    def _take_over(self) -> None:
        """Point workers at this incarnation's folder (its first full file exists) and delete earlier ones."""
        write_atomic(self.root / POINTER, self.folder.name + "\n")
        for old in self.root.iterdir():
            if old.is_dir() and old != self.folder:
                log.info("weights: deleting %s, an earlier publisher's files", old)
                shutil.rmtree(old, ignore_errors=True)

    def _prune(self) -> None:
        pubs = publications(self.folder)
        fulls = [v for v, kind, _ in pubs if kind == "full"]
        if len(fulls) > 2:
            for v, _, p in pubs:
                if v < fulls[-2]:
                    p.unlink(missing_ok=True)


class FileSubscriber:
    """A worker's side: brings its engine's weights to a version by replaying files, joining from the newest
    full publication when it has none yet or when a file does not apply (lost sync)."""

    def __init__(self, run_dir: Path, cfg: SyncConfig, device="cpu"):
        self.root = Path(run_dir) / "weights"
        self.folder: Path | None = None  # the publisher's folder this subscriber's weights come from
        self.cfg, self.device = cfg, device
        self.subscriber = Subscriber(FileWire(None, False), cfg, device)
        self.applied = -1
        self.joins = 0

    def catch_up(self, views: dict[str, torch.Tensor], version: int) -> dict[str, float]:
        """Apply publications until the views hold `version` (whose file must exist)."""
        out = {"sync/apply_s": 0.0, "sync/verify_s": 0.0, "sync/bytes": 0.0, "sync/joined": 0.0}
        for attempt in range(2):
            path = self.root
            try:
                self._follow_publisher()
                plan, joining = self._plan(version)
                out["sync/joined"] = float(joining)
                for v, _, path in plan:
                    with open(path, "rb") as f:
                        self.subscriber.wire = FileWire(f, False)
                        m = self.subscriber.receive(views)
                    if int(m["sync/version"]) != v:
                        raise SyncError(f"{path} holds version {int(m['sync/version'])}")
                    for k in ("sync/apply_s", "sync/verify_s", "sync/bytes"):
                        out[k] += m[k]
                    self.applied = v
                return out
            except (SyncError, OSError, KeyError, ValueError, RuntimeError) as err:
                # a damaged or vanished file: the views are not to be trusted until a full one rewrites them
                self.applied, self.subscriber.synced = -1, False
                if attempt:
                    raise SyncError(f"weights: {path} does not apply even after rejoining ({err})") from err
                log.warning("weights: rejoining from a full publication (%s: %s)", path, err)
        return out

    def _follow_publisher(self) -> None:
        """Read which folder the running publisher writes; a new one (a requeue, a resume) means a rejoin."""
        try:
            folder = self.root / (self.root / POINTER).read_text().strip()
        except FileNotFoundError as err:
            raise SyncError(f"{self.root}: nothing published yet") from err
        if folder != self.folder:
            if self.folder is not None:
                log.warning("weights: a new publisher (%s) replaced %s: rejoining", folder.name, self.folder.name)
            self.folder, self.applied, self.subscriber.synced = folder, -1, False

    def _plan(self, version: int) -> tuple[list[tuple[int, str, Path]], bool]:
        """The files to read, in order, and whether that is a join (from a full publication). Weights newer
        than `version` (a re-issued evaluation of an older version) are rebuilt from the newest full file at or
        before it: a task is done with the version it names, or not at all."""
        pubs = [p for p in publications(self.folder) if p[0] <= version]
        if not pubs or pubs[-1][0] != version:
            raise SyncError(f"{self.folder}: no publication of version {version}")
        if self.applied == version:
            return [], False
        if self.applied >= 0 and any(v == self.applied + 1 for v, _, _ in pubs):
            return [p for p in pubs if p[0] > self.applied], False
        fulls = [p for p in pubs if p[1] == "full"]
        if not fulls:
            raise SyncError(f"{self.folder}: no full publication at or before version {version}")
        self.joins += 1
        self.subscriber.synced = False
        return [p for p in pubs if p[0] >= fulls[-1][0]], True
