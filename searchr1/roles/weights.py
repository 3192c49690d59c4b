"""The WEIGHTS transfer, both ends: trainer rank 0 announces a version on the channel and then publishes its
bits on the weight-sync transport; a rollout rank waits for the announcement (bounded by the trainer's
liveness) and only then enters the collective, so no rank ever sits in a broadcast waiting for the other
role's work.
"""
from __future__ import annotations

from searchr1.protocol import WEIGHTS, Channel
from searchr1.weightsync import Publisher, Subscriber


class WeightsOut:
    def __init__(self, channel: Channel, publisher: Publisher):
        self.channel, self.publisher = channel, publisher

    def publish(self, weights: dict, version: int) -> dict[str, float]:
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
            self.channel.wait(WEIGHTS, [self.publisher_member], version=self.next)
            m = self.subscriber.receive(self.views())
            if int(m["sync/version"]) != self.next:
                raise RuntimeError(f"expected weights version {self.next}, the publication says {m['sync/version']}")
            out = {**m, "sync/apply_s": out["sync/apply_s"] + m["sync/apply_s"],
                   "sync/verify_s": out["sync/verify_s"] + m["sync/verify_s"]}
            self.applied, self.next = self.next, self.next + 1
        return out
