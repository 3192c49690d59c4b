"""Liveness: slow is not dead. A member of the job is dead when it has failed, or has shown no sign of life
(a heartbeat) for `heartbeat_timeout_s`; one that is slow but alive is waited for, however long its work takes.

- Every member (a rank of the world, or an elastic rollout worker) runs a `Heartbeat` thread of its own that
  increments `hb/<member>` in the job's store every `heartbeat_period_s`, whatever its main thread is doing:
  generating, training, evaluating, or blocked in a collective.
- A member that fails posts `failed/<member>` with its reason before it exits (`post_failure`), so whoever waits
  for it fails at once, naming it.
- `Liveness.wait` waits for keys on the store in short slices and between slices checks the members it waits
  for. It never guesses how long work takes, so no wait can fail because a machine is busy.
- A stop request (a signal, `StopFlag`) is seen between slices too: a stoppable wait never outlasts the wish to
  stop, and a wait that may not end on it (one whose producer is committed to a collective this member must
  join) still makes it the job's stop (`STOP_KEY`), for trainer 0 to act on.

Times are measured on the waiter's own monotonic clock (counters, not timestamps, travel), so clock skew
between hosts cannot make a live member look dead.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable

log = logging.getLogger(__name__)

SLICE_S = 1.0  # how often a waiter checks the liveness of the members it waits for
POLL_MAX_S = 0.05  # the longest pause between two looks at the store: bounds a transfer's added latency


class MemberLost(RuntimeError):
    """A member we wait for has failed or fallen silent; the message names it."""


class StopRequested(RuntimeError):
    """A stop was requested (signal) while waiting."""


class RunEnded(RuntimeError):
    """While waiting for something else, the run was declared over (an abort key appeared)."""


EXIT_STOPPED = 75  # EX_TEMPFAIL: stopped on request after saving what a restart needs; run it again to go on


class Stopped(SystemExit):
    """Raised by a role that stopped on request (preemption, time limit) once its state is safe."""

    def __init__(self, reason: str):
        super().__init__(EXIT_STOPPED)
        self.reason = reason


class StopFlag:
    """Set from a signal handler, read at safe points and between wait slices."""

    def __init__(self):
        self._event, self.reason = threading.Event(), ""

    def set(self, reason: str) -> None:
        self.reason = self.reason or reason
        self._event.set()

    def __bool__(self) -> bool:
        return self._event.is_set()


STOP = StopFlag()
STOP_KEY = "stop"  # on the store: a member saw a stop request, so every member stops


def spread_stop(store, reason: str) -> None:
    """Make a stop seen by one member a stop of the whole job (a signal may reach some tasks only)."""
    try:
        store.set(STOP_KEY, reason)
    except Exception:  # noqa: BLE001 - the store's host is gone: the job is ending anyway
        pass


class Heartbeat:
    """A daemon thread beating for `member` on its own store client (`connect()` makes one)."""

    def __init__(self, connect: Callable[[], object], member: str, period_s: float):
        self.connect, self.member, self.period_s = connect, member, period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{member}", daemon=True)

    def start(self) -> "Heartbeat":
        store = self.connect()
        store.add(f"hb/{self.member}", 1)  # alive from the start, before the thread first runs
        self._store = store
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self._store.add(f"hb/{self.member}", 1)
            except Exception as err:  # noqa: BLE001 - the store's host is gone: the job is ending
                log.warning("heartbeat of %s stopped: %s", self.member, err)
                return

    def stop(self) -> None:
        """Stop beating and wait for the thread: a beat still in flight when the store's host exits, or when the
        interpreter tears down, aborts the process from C++ ("terminate called without an active exception")."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()


def post_failure(store, member: str, reason: str) -> None:
    """Tell every waiter that `member` failed (best effort: the store may be gone already)."""
    try:
        store.set(f"failed/{member}", reason[-2000:])
    except Exception:  # noqa: BLE001
        pass


class Liveness:
    """One waiter's view of the members it waits for. `describe(member)` names a member in errors."""

    def __init__(self, store, timeout_s: float, describe: Callable[[str], str] = str, stop: StopFlag = STOP):
        self.store, self.timeout_s, self.describe, self.stop = store, timeout_s, describe, stop
        self._seen: dict[str, tuple[int, float]] = {}  # member -> (last counter, when it last changed)
        self._spread = False  # this member's own stop request is on the store

    def silent_for(self, member: str) -> float:
        """Seconds since `member`'s heartbeat last moved (0 on first sight: a member gets a full timeout)."""
        count, now = int(self.store.add(f"hb/{member}", 0)), time.monotonic()
        last = self._seen.get(member)
        if last is None or count != last[0]:
            self._seen[member] = (count, now)
            return 0.0
        return now - last[1]

    def check(self, members: Iterable[str], stoppable: bool = True) -> None:
        """Raise MemberLost if any of `members` failed or fell silent; StopRequested if a stop was asked
        (and `stoppable`). A stop that may not end this wait is put on the store, so that trainer 0 decides it."""
        if self.stop:
            if stoppable:
                raise StopRequested(self.stop.reason)
            if not self._spread:
                spread_stop(self.store, self.stop.reason)
                self._spread = True
                log.info("stop requested (%s) in a wait that must go on: passed on to the job", self.stop.reason)
        if stoppable and self.store.check([STOP_KEY]):  # a stop that reached another member reaches us too
            raise StopRequested(self.store.get(STOP_KEY).decode(errors="replace"))
        members = list(members)
        failed = [m for m in members if self.store.check([f"failed/{m}"])]
        if failed:
            reason = self.store.get(f"failed/{failed[0]}").decode(errors="replace")
            raise MemberLost(f"{self.describe(failed[0])} failed: {reason}")
        for m in members:
            silent = self.silent_for(m)
            if silent > self.timeout_s:
                raise MemberLost(f"{self.describe(m)} has shown no sign of life for {silent:.0f} s "
                                 f"(cluster.heartbeat_timeout_s={self.timeout_s:g}): taken for dead")

    def wait(self, keys: list[str], members: Iterable[str], what: str = "", stoppable: bool = True,
             abort: list[str] = ()) -> None:
        """Block until every key exists, for as long as `members` are alive. A stop request ends the wait unless
        not `stoppable`; any of the `abort` keys appearing ends it with RunEnded.

        Polls with `check` (backing off from 1 ms to POLL_MAX_S), not with the store's timed `wait`, whose
        every timeout logs a warning: a wait may last hours and the rank logs stay readable."""
        members, delay, looked = list(members), 0.001, time.monotonic()
        while True:
            try:
                if self.store.check(keys):
                    return
                if time.monotonic() - looked < SLICE_S:
                    time.sleep(delay)
                    delay = min(2 * delay, POLL_MAX_S)
                    continue
                looked = time.monotonic()
                if abort and any(self.store.check([k]) for k in abort):
                    raise RunEnded(f"the run ended while waiting for {what or keys}")
                self.check(members, stoppable)
            except MemberLost as err:
                raise MemberLost(f"{err} (while waiting for {what or keys})") from None
            except RuntimeError as err:  # the store's host is gone (DistNetworkError)
                if isinstance(err, (RunEnded, StopRequested)):
                    raise
                raise MemberLost(f"the job's store stopped answering while waiting for {what or keys}: "
                                 f"{err}") from err
