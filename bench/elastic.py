"""Elastic rollouts, measured in one run: throughput with 2, then 3, then 2 rollout workers, and what a worker's
death costs.

One elastic run of the smoke experiment on local processes (2 trainers, 2 workers, `--units` units per step).
After `--phase` steps a third worker joins from a second launch (`join=RUN_DIR`); `--phase` steps later that
launch gets SIGTERM and its worker leaves; at step 3 x `--phase` worker 0 SIGKILLs itself (SEARCHR1_FAULTS; its
task restarts it in place). Per phase: steps, seconds, trajectories per second (from metrics.jsonl, the steps' own seconds);
for the death: the seconds from the kill to the next step's line and to the restarted worker's rejoin.

    python bench/elastic.py                  # ~3 min here; writes results/bench/elastic.json
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from searchr1 import metrics as K  # noqa: E402
from searchr1.metrics import read_metrics  # noqa: E402

ELASTIC = ["+experiment=smoke", "cluster.elastic.enabled=true", "eval_every=0", "eval_before=false",
           "checkpoint_every=0"]


def train_lines(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    try:
        return [x for x in read_metrics(path) if x[K.KIND] == K.TRAIN]
    except ValueError:  # a line being written
        return []


def wait_for_step(run: Path, step: int, main: subprocess.Popen) -> float:
    """Until `step` steps are recorded (bounded by the run being alive); the time it was seen."""
    while len(train_lines(run)) < step:
        if main.poll() is not None:
            raise SystemExit(f"the run ended (exit {main.returncode}) before step {step}: see {run}/logs")
        time.sleep(0.05)
    return time.time()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase", type=int, default=12, help="steps per phase")
    ap.add_argument("--units", type=int, default=6, help="work units per step")
    ap.add_argument("--unit-sleep", type=float, default=0.0,
                    help="seconds every worker sleeps per unit, off this CPU: generation bound by a device of its "
                         "own, as on a GPU cluster (0: generation on the 2 shared cores)")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench" / "elastic.json"))
    args = ap.parse_args()
    steps = 4 * args.phase
    root = Path(tempfile.mkdtemp(prefix="bench-elastic-"))
    env = dict(os.environ, WANDB_MODE="disabled")
    env.pop("SEARCHR1_FAULTS", None)
    killed = root / "killed"  # created by the fault as it fires: the time of the death
    kill = f"rank=worker0,point=rollout,step={3 * args.phase},do=kill,once={killed}"
    sleep = [f"rank=worker{i},point=rollout,do=sleep:{args.unit_sleep},times=1000000" for i in (0, 1)]
    sleep = sleep if args.unit_sleep > 0 else []
    main_p = subprocess.Popen([sys.executable, "launch.py", *ELASTIC, f"run_root={root / 'run'}", f"steps={steps}",
                               "cluster.rollout_ranks=2", f"cluster.elastic.units_per_step={args.units}",
                               f"algo.questions_per_step={args.units}"],
                              cwd=ROOT, env=dict(env, SEARCHR1_FAULTS=";".join(sleep + [kill])), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    run = None
    for line in main_p.stdout:
        if line.startswith("run folder: "):
            run = Path(line.split(": ", 1)[1].strip())
            break
    drain = subprocess.Popen(["cat"], stdin=main_p.stdout, stdout=subprocess.DEVNULL)  # keep its pipe flowing
    marks = {"join_asked": wait_for_step(run, args.phase, main_p)}
    join = subprocess.Popen([sys.executable, "launch.py", *ELASTIC, f"run_root={root / 'join'}", f"join={run}",
                             "cluster.rollout_ranks=1"], cwd=ROOT, env=dict(env, SEARCHR1_FAULTS=";".join(sleep[:1])),
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    marks["leave_asked"] = wait_for_step(run, 2 * args.phase, main_p)
    join.send_signal(signal.SIGTERM)
    join.wait()
    while not killed.exists():  # worker 0 kills itself as it starts a unit of step 3 x phase
        if main_p.poll() is not None:
            raise SystemExit(f"the run ended (exit {main_p.returncode}) before the kill: see {run}/logs")
        time.sleep(0.05)
    marks["kill"] = killed.stat().st_mtime
    n_kill = len(train_lines(run))
    marks["next_step"] = wait_for_step(run, n_kill + 1, main_p)
    rc = main_p.wait()
    drain.wait()
    train = train_lines(run)
    if rc != 0 or len(train) != steps:
        raise SystemExit(f"run ended with exit {rc} after {len(train)} of {steps} steps: see {run}/logs")
    phases = {"2 workers": train[1:args.phase], "3 workers": train[args.phase + 2:2 * args.phase],
              "2 workers again": train[2 * args.phase + 2:3 * args.phase]}  # the steps of a change left out
    report = {"steps": steps, "units_per_step": args.units, "unit_sleep_s": args.unit_sleep, "cpus": os.cpu_count(),
              "phases": {}}
    for name, rows in phases.items():
        secs = sum(x[K.STEP_S] for x in rows)
        report["phases"][name] = {
            "steps": len(rows), "seconds": secs, "trajectories_per_s": sum(x[K.TRAJECTORIES] for x in rows) / secs,
            "live_workers": sorted({int(x["elastic/workers"]) for x in rows})}
    base = report["phases"]["2 workers"]["trajectories_per_s"]
    for p in report["phases"].values():
        p["ratio_vs_2_workers"] = p["trajectories_per_s"] / base
    after = train[n_kill:]
    report["death"] = {
        "kill_to_next_step_line_s": marks["next_step"] - marks["kill"],
        "units_reissued": sum(x.get("elastic/reissued", 0) for x in after),
        "units_lost": sum(x.get("elastic/lost", 0) for x in train),
        "rejoin_s": max((x.get("elastic/rejoin_s", 0) for x in after), default=0),
        "trajectories_every_step": sorted({x[K.TRAJECTORIES] for x in train})}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
