"""The WEIGHTS transfer, both ends: trainer rank 0 announces a version on the channel and then publishes its
bits on the weight-sync transport; a rollout rank waits for the announcement (bounded by the trainer's
liveness) and only then enters the collective, so no rank ever sits in a broadcast waiting for the other
role's work. Nor does trainer 0 ever sit in one alone: once it has begun a step it publishes that step's weights,
even if a stop arrived meanwhile, so a rollout's wait for an announcement ends only on it, or on the trainers'
DONE (the channel's abort), never on the rollout's own stop request (which the wait puts on the store for
trainer 0 to decide). The synchronous schedule receives straight into the engine (`WeightsIn`); the overlapping
ones receive into a staging copy while the engine generates (`StagedIn`).
"""
from __future__ import annotations

import threading
import time
from collections import deque

from searchr1.liveness import RunEnded
from searchr1.protocol import WEIGHTS, Channel
from searchr1.weightsync import Publication, Publisher, Subscriber, replay


class WeightsOut:
    def __init__(self, channel: Channel, publisher: Publisher):
        self.channel, self.publisher = channel, publisher

    def publish(self, weights: dict, version: int) -> dict[str, float]:
        if getattr(self.publisher, "announce_after", False):  # files: announced once readable
            m = self.publisher.publish(weights, version=version)
            self.channel.put(WEIGHTS, version, version=version)
            return m
        # a broadcast: the receivers enter the collective only after the announcement, so it comes first
        self.channel.put(WEIGHTS, version, version=version)
        return self.publisher.publish(weights, version=version)


class WeightsIn:
    """Receives every publication in order straight into the engine's live weights (the synchronous path)."""

    def __init__(self, channel: Channel, subscriber: Subscriber, views, publisher_member: str, first: int):
        self.channel, self.subscriber, self.views = channel, subscriber, views
        self.publisher_member, self.next = publisher_member, first
        self.applied = -1  # the version the engine holds; -1 before the first (full) export

    def apply_until(self, version: int) -> dict[str, float]:
        """Receive publications until the engine holds `version`; the last receive's metrics (sums of seconds)."""
        out = {"sync/apply_s": 0.0, "sync/verify_s": 0.0}
        while self.applied < version:
            self.channel.wait(WEIGHTS, [self.publisher_member], stoppable=False, version=self.next)
            m = self.subscriber.receive(self.views())
            if int(m["sync/version"]) != self.next:
                raise RuntimeError(f"expected weights version {self.next}, the publication says {m['sync/version']}")
            out = {**m, "sync/apply_s": out["sync/apply_s"] + m["sync/apply_s"],
                   "sync/verify_s": out["sync/verify_s"] + m["sync/verify_s"]}
            self.applied, self.next = self.next, self.next + 1
        return out

    def close(self) -> None:
        """Nothing runs in the background here."""


class StagedIn:
    """Receives every publication as soon as it is announced, in a thread of its own, into a staging copy of
    the weights, so the trainer never waits for this rank to stop generating. The engine takes versions from
    the staging at safe points (between generate calls, never inside one), in order and exactly as published:
    each kept publication is replayed onto the live weights and checked against its digests."""

    def __init__(self, channel: Channel, subscriber: Subscriber, views, publisher_member: str, first: int):
        self.channel, self.subscriber, self.publisher_member = channel, subscriber, publisher_member
        self.live = views()
        self.staging = {k: v.clone() for k, v in self.live.items()}
        self.queue: deque[Publication] = deque()
        self.cond = threading.Condition()
        self.error: BaseException | None = None
        self.ended: RunEnded | None = None  # the trainers ended the run: nothing more will be published
        self.applied = -1
        self.thread = threading.Thread(target=self._receive_all, args=(first,), name="weights-in", daemon=True)
        self.thread.start()

    def _receive_all(self, version: int) -> None:
        try:
            while True:
                self.channel.wait(WEIGHTS, [self.publisher_member], stoppable=False, version=version)
                pub = Publication(version, [])
                self.subscriber.receive(self.staging, keep=pub)
                with self.cond:
                    self.queue.append(pub)
                    self.cond.notify_all()
                version += 1
        except RunEnded as end:
            with self.cond:
                self.ended = end
                self.cond.notify_all()
        except BaseException as err:  # noqa: BLE001 - handed to the main thread, which raises it
            with self.cond:
                self.error = err
                self.cond.notify_all()

    def close(self) -> None:
        """Wait for the receiving thread, which leaves once the trainer announced the end of the run (the caller
        has seen DONE): a thread still inside a store call at interpreter exit aborts the process."""
        self.thread.join()

    def received(self) -> int:
        """The newest version in staging (-1 before the first)."""
        with self.cond:
            return self.queue[-1].version if self.queue else self.applied

    def apply_until(self, version: int) -> dict[str, float]:
        """Wait until `version` is in staging (the receiving thread's wait is bounded by the trainer's
        liveness), then replay every kept publication up to it onto the live weights."""
        with self.cond:
            while self.received() < version:
                if self.error is not None:
                    raise self.error
                if self.ended is not None:  # a version the trainers will not publish (they stopped)
                    raise RunEnded(f"{self.ended}; weights version {version} will not come")
                self.cond.wait(timeout=1.0)
            todo = []
            while self.queue and self.queue[0].version <= version:
                todo.append(self.queue.popleft())
        t0 = time.perf_counter()
        for pub in todo:
            replay(pub, self.live, self.subscriber.impl)
            self.applied = pub.version
        return {"sync/apply_s": time.perf_counter() - t0, "sync/verify_s": 0.0}
