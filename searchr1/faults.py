"""Fault injection at named points of the roles, for the tests of what the job does when a rank is slow, dies or
hangs. Off unless SEARCHR1_FAULTS is set; nothing else reads it.

    SEARCHR1_FAULTS="rank=3,point=rollout,step=1,do=sleep:6;rank=2,point=train,do=exit:3"

Each rule: `rank` (a global rank, or `workerN` for elastic rollout worker slot N), `point` (rollout: before a
unit is generated; train: before an optimizer step; eval: before a held-out evaluation; publish: before
weights are published), optional `step` (0-based step, or the weights version for eval), optional `times`
(how often the rule may fire in one process; default 1), optional `once=PATH` (fire only if PATH does not
exist, and create it: once across restarts of a process), optional `after=PATH` (fire only once PATH exists: in a
process restarted after a `once` rule fired, say), and `do`: sleep:SECONDS (slow but alive: the
heartbeat thread keeps beating), exit:CODE, kill (SIGKILL itself), stop (SIGSTOP itself: alive to the OS,
silent to the job), lr:FACTOR (point=train: the learning rate multiplied from this step on, an injected collapse;
give it to every trainer rank, or the replicas part), wait:PATH (held, alive, until PATH exists) and touch:PATH
(create PATH): with the two, a test orders events across processes by what happened, never by a guess of time.
"""
from __future__ import annotations

import os
import signal
import time

ENV = "SEARCHR1_FAULTS"
POINTS = ("rollout", "train", "eval", "publish")
_fired: dict[int, int] = {}


def _rules() -> list[dict[str, str]]:
    text = os.environ.get(ENV, "")
    rules = []
    for i, part in enumerate(p for p in text.split(";") if p.strip()):
        rule = dict(kv.split("=", 1) for kv in part.split(","))
        if rule.get("point") not in POINTS or "rank" not in rule or "do" not in rule:
            raise ValueError(f"{ENV} rule {i} ({part!r}): needs rank=, point= (one of {POINTS}) and do=")
        rules.append(rule)
    return rules


def hit(point: str, who: int | str, step: int) -> float | None:
    """Act on every rule for this point, rank (or worker name) and step (a no-op when SEARCHR1_FAULTS is
    unset); returns an lr:FACTOR rule's factor, for the caller to apply."""
    if ENV not in os.environ:
        return None
    factor = None
    for i, rule in enumerate(_rules()):
        if rule["point"] != point or rule["rank"] != str(who) or int(rule.get("step", step)) != step:
            continue
        if _fired.get(i, 0) >= int(rule.get("times", 1)):
            continue
        if "after" in rule and not os.path.exists(rule["after"]):
            continue
        if "once" in rule:
            if os.path.exists(rule["once"]):
                continue
            open(rule["once"], "w").close()
        _fired[i] = _fired.get(i, 0) + 1
        action, _, arg = rule["do"].partition(":")
        print(f"[faults] {f'rank {who}' if isinstance(who, int) else who} at {point} step {step}: {rule['do']}",
              flush=True)
        if action == "sleep":
            time.sleep(float(arg))
        elif action == "exit":
            os._exit(int(arg or 1))
        elif action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif action == "lr":
            factor = float(arg)
        elif action == "wait":
            while not os.path.exists(arg):
                time.sleep(0.05)
        elif action == "touch":
            open(arg, "a").close()
        else:
            raise ValueError(f"{ENV} rule {i}: unknown action {rule['do']!r}")
    return factor
