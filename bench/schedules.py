"""Synchronous versus overlapping schedules on the learning experiment: idle time won back, exact match lost.

Every run starts from the same warm-start checkpoint (made once, first) with the same seed and questions per
step, on the local placement that gives the trainer and the rollout a core each (`cluster.placement=split`,
1 trainer + 1 rollout rank), so that overlap is real on a CPU as it is on separate GPUs:

    sync                      the seed's loop
    pipelined_k1              rollouts one version behind
    pipelined_k2_ratio        two behind, PPO's ratio against the behaviour policy (no correction)
    pipelined_k2_decoupled    two behind, AReaL's decoupled objective with a truncated importance weight
    pipelined_k4_decoupled    four behind, the same objective (where exact match starts to fall, if it does)
    pipelined_k8_decoupled    eight behind, the same objective
    streaming_k2              continuous generation, weights taken between turns, admission bound 2
    streaming_k2_partial      the same with partial rollouts: unfinished groups may wait for the next step

Every run does `--steps` RL steps (equal steps). Then each overlapping mode runs again, from the same start and
seed, for the steps it had completed when sync's RL time was up (extrapolated from its mean step where it was
faster): a run repeats itself step by step, so that rerun is the first run stopped at sync's wall time, and its
end evaluation is held-out EM at equal wall time (`--equal-steps` skips these reruns). Written:
results/schedules/<name>/ (each run's light files) and results/bench/schedules.json (every figure), plus a
model of the production shape (2 trainer + 14 rollout GPUs, Qwen2.5-3B, the seed's 24.3 s per step) fed by the
measured phase times.

    python bench/schedules.py                 # ~2 h on 2 cores
    python bench/schedules.py --steps 6 --eval-every 3 --questions 40   # a quick look (~25 min)
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from searchr1 import metrics as K  # noqa: E402
from searchr1.stats import paired_predictions, wilson  # noqa: E402
from searchr1.evaluation import read_predictions  # noqa: E402

MODES = {
    "sync": [],
    "pipelined_k1": ["schedule=pipelined", "schedule.max_lag=1"],
    "pipelined_k2_ratio": ["schedule=pipelined", "schedule.max_lag=2", "algo.off_policy=ratio"],
    "pipelined_k2_decoupled": ["schedule=pipelined", "schedule.max_lag=2", "algo.off_policy=decoupled"],
    "pipelined_k4_decoupled": ["schedule=pipelined", "schedule.max_lag=4", "algo.off_policy=decoupled"],
    "pipelined_k8_decoupled": ["schedule=pipelined", "schedule.max_lag=8", "algo.off_policy=decoupled"],
    "streaming_k2": ["schedule=streaming", "schedule.max_lag=2", "algo.off_policy=decoupled"],
    # partial rollouts: a rollout rank may set unfinished groups aside once it has generated 512 tokens for a step
    # (about one turn of its 16 episodes), so a step's last turns need not hold it back
    "streaming_k2_partial": ["schedule=streaming", "schedule.max_lag=2", "algo.off_policy=decoupled",
                             "schedule.partial_tokens=512"],
}
PLACEMENTS = {
    # a core each, as separate GPUs would: overlap hides the shorter phase behind the longer one at best
    "split": ["cluster.trainer_ranks=1", "cluster.rollout_ranks=1", "cluster.placement=split"],
    # the CPU experiment's own (2 trainer + 2 rollout ranks, one of each on every core): when both phases run
    # at once the OS shares each core between them, so an idle role's core time goes to the other
    "alternate": ["cluster.placement=alternate"],
}
EVAL_S = "time/rollout/eval_s"
# a step's time varies by a few percent between runs of one schedule: a run within 2% of sync's RL time has kept pace
WALL_SLACK = 1.02
SEED_STEP_S = 24.3  # the seed's seconds per step, 2 trainer + 14 rollout GPUs, Qwen2.5-3B (synchronous)


def launch(run_root: Path, name: str, *overrides: str, placement: str = "split") -> Path:
    cmd = [sys.executable, "launch.py", "+experiment=search_r1_cpu", f"run_root={run_root}", f"run_name={name}",
           *PLACEMENTS[placement], *overrides]
    run = run_root / name
    status = run / "status.json"
    if status.exists() and json.loads(status.read_text()).get("state") == "COMPLETED":
        print(f"{name}: completed before, reused", flush=True)  # --stamp of an earlier bench
        return run
    print("$", " ".join(cmd), flush=True)
    t0 = time.time()
    r = subprocess.run(cmd, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"{name} failed ({r.returncode})")
    (run / "wall_s.txt").write_text(f"{time.time() - t0:.1f}\n")
    return run


def summarize(run: Path, sync_wall_s: float | None) -> dict:
    recs = K.read_metrics(run / "metrics.jsonl")
    train = [r for r in recs if r[K.KIND] == K.TRAIN]
    evals = [r for r in recs if r[K.KIND] == K.EVAL]
    rl = [r for r in train if r.get("stage", "rl") == "rl"]
    # an evaluation inside a step (the start model's, in sync only) is neither training time nor overlap
    wall = sum(r[K.STEP_S] - r.get(EVAL_S, 0.0) for r in rl)
    plain = [r for r in rl if not r.get(EVAL_S)]
    out = {"steps": len(rl), "rl_wall_s": wall, "steps_per_hour": 3600 * len(rl) / wall if wall else 0.0,
           "useful_work_fraction": sum(r[K.USEFUL_FRACTION] for r in plain) / max(len(plain), 1),
           "idle_s_per_step": {role: sum(r.get(f"time/{role}/wait_s", 0.0) for r in plain) / max(len(plain), 1)
                               for role in ("trainer", "rollout")},
           "lag_histogram": {}, "importance_weights": {},
           "groups_carried": {"out": sum(r.get(K.GROUPS_CARRIED_OUT, 0.0) for r in rl),
                              "in": sum(r.get(K.GROUPS_CARRIED_IN, 0.0) for r in rl)}}
    for r in rl:
        for k, v in r.items():
            if k.startswith("lag/count/"):
                out["lag_histogram"][k.split("/")[-1]] = out["lag_histogram"].get(k.split("/")[-1], 0) + v
    # the importance-weight statistics under whatever names the objective logs them (train/is/*)
    for key in sorted({k for r in rl for k in r if k.startswith("train/is/")}) + ["train/approx_kl", "train/clip_frac"]:
        vals = [r[key] for r in rl if isinstance(r.get(key), (int, float))]
        if vals:
            out["importance_weights"][key] = {"mean": sum(vals) / len(vals), "max": max(vals)}
    elapsed = rl_clock(train)
    out["evals"] = []
    for e in evals:
        lo, hi = wilson(e[K.EVAL_EM_COUNT], e[K.EVAL_N])
        out["evals"].append({"version": e[K.STEP], "em": f"{e[K.EVAL_EM_COUNT]}/{e[K.EVAL_N]}",
                             "em_pct": 100 * e[K.EVAL_EM], "ci95": [100 * lo, 100 * hi], "f1": e[K.EVAL_F1],
                             "rl_wall_s": elapsed.get(e[K.STEP], 0.0)})
    if sync_wall_s is not None:
        out["steps_at_sync_wall_time"] = steps_at_wall(elapsed, sync_wall_s)
    return out


def rl_clock(train: list[dict]) -> dict[int, float]:
    """The RL seconds done after each step (an evaluation inside a step is not training time)."""
    elapsed, clock = {}, 0.0
    for r in train:
        clock += r[K.STEP_S] - r.get(EVAL_S, 0.0) if r.get("stage", "rl") == "rl" else 0.0
        elapsed[r[K.STEP]] = clock
    return elapsed


def steps_at_wall(elapsed: dict[int, float], wall_s: float) -> int:
    """The steps a run had completed when `wall_s` RL seconds were up; past its last step, what its mean step
    would have added. At least one: every run is evaluated after a step."""
    steps, budget = max(elapsed), wall_s * WALL_SLACK
    if elapsed[steps] > budget:
        return max(1, sum(1 for s in elapsed if elapsed[s] <= budget))
    return max(steps, math.floor(budget / (elapsed[steps] / steps)))


def vs_sync(base: list[dict], path: Path) -> dict:
    p = paired_predictions(base, read_predictions(path))
    return {"sync": p.a_correct, "this": p.b_correct, "n": p.n, "only_sync": p.only_a, "only_this": p.only_b,
            "mcnemar_p": p.p_value}


def production_model(sync: dict, runs: dict) -> dict:
    """Step time and useful-work fraction of each mode at the production shape. Assumptions: the generation
    share of a synchronous step is the one measured here (and, for comparison, 0.5/0.7/0.9); the overlapping
    schedules take max(generation + apply, training + publish) per step; 14 rollout and 2 trainer GPUs each
    busy with their own phase; weight bytes at the seed's 165 MB delta per step over 25 GB/s."""
    gen = sync["phase_s"]["rollout"]
    train = sync["phase_s"]["train"]
    share = gen / (gen + train) if gen + train else 0.5
    publish = 165e6 / 25e9
    out = {"assumptions": production_model.__doc__.split("Assumptions: ")[1].replace("\n   ", ""), "modes": {}}
    for label, s in (("measured_share", share), ("share_0.5", 0.5), ("share_0.7", 0.7), ("share_0.9", 0.9)):
        g, t = s * (SEED_STEP_S - publish), (1 - s) * (SEED_STEP_S - publish)
        modes = {"sync": g + t + publish}
        for name in runs:
            if name != "sync":
                modes[name] = max(g + 0.05, t + publish)
        out["modes"][label] = {"generation_share": s, **{
            name: {"step_s": step, "useful_work_fraction": (14 * g + 2 * t) / (16 * step),
                   "steps_per_hour": 3600 / step} for name, step in modes.items()}}
    return out


def machine_model(sync_run: Path, results: dict) -> dict:
    """The production model's rule applied to this machine's shape (1 trainer + 1 rollout rank, a core each) and
    fed by sync's own steps, beside what the overlapping runs measured: the check of the projection. Two forms:
    from the mean phases (as the production model is fed), and step by step (each step takes the longer of its
    two phases; the first has nothing to overlap)."""
    recs = [r for r in K.read_metrics(sync_run / "metrics.jsonl") if r[K.KIND] == K.TRAIN and r.get("stage") != "sft"]
    gen = [r.get("time/rollout/rollout_s", 0.0) + r.get("time/rollout/sync_s", 0.0) for r in recs]
    train = [r.get("time/trainer/train_s", 0.0) + r.get("time/trainer/sync_s", 0.0) for r in recs]
    busy = sum(gen) + sum(train)
    g, t = sum(gen) / len(gen), sum(train) / len(train)
    step_mean = max(g, t)
    steps = [gen[0] + train[0]] + [max(a, b) for a, b in zip(gen[1:], train[1:])]
    step_each = sum(steps) / len(steps)
    out = {"assumptions": "1 trainer + 1 rollout rank on a core each; a synchronous step is generation + training "
                          "(+ their weight transfer); an overlapping one the longer of the two; fed by sync's "
                          "measured phases", "phase_s": {"generation": g, "training": t},
           "predicted": {"sync": {"step_s": g + t, "useful_work_fraction": 0.5},
                         "overlapped_from_means": {"step_s": step_mean, "useful_work_fraction": (g + t) / (2 * step_mean),
                                                   "speedup": (g + t) / step_mean},
                         "overlapped_step_by_step": {"step_s": step_each,
                                                     "useful_work_fraction": busy / (2 * sum(steps)),
                                                     "speedup": (g + t) / step_each}},
           "measured": {}}
    for name, r in results.items():
        if r.get("steps"):
            out["measured"][name] = {"step_s": 3600 / r["steps_per_hour"],
                                     "useful_work_fraction": r["useful_work_fraction"],
                                     "speedup": r.get("speedup_steps_per_hour", 1.0)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--questions", type=int, default=200, help="held-out questions per evaluation")
    ap.add_argument("--warm", help="start every run from this model folder (e.g. a run's checkpoints/step_N/model) "
                                   "instead of making a warm start first")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    ap.add_argument("--equal-steps", action="store_true",
                    help="compare at equal steps only (no reruns stopped at sync's wall time)")
    ap.add_argument("--run-root", default=str(ROOT / "runs" / "schedules"))
    ap.add_argument("--stamp", help="the runs of an earlier bench (their folder suffix): completed ones are reused")
    ap.add_argument("--out", default=str(ROOT / "results"))
    ap.add_argument("--placement", choices=list(PLACEMENTS), default="split",
                    help="split writes bench/schedules.json; another writes bench/schedules_<placement>.json")
    ap.add_argument("--seed", type=int, help="the RL runs' seed (data order, sampling); the warm start keeps the "
                                             "experiment's, so every seed starts from the same model. Outputs get _s<seed>")
    ap.add_argument("--pool", nargs="+", metavar="DIR",
                    help="pool the exported bench folders of several seeds (each holds schedules.json and <mode>/) into "
                         "OUT/bench/schedules_seeds.json, a table and a plot; runs nothing")
    ap.add_argument("--readme", help="with --pool: also write the table into this file's schedules block")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="a Hydra override given to every run, warm start included (repeatable)")
    ap.add_argument("--model-only", action="store_true",
                    help="recompute the machine model into the existing schedules.json from its exported sync run")
    args = ap.parse_args()
    run_root, out = Path(args.run_root), Path(args.out)
    if args.pool:
        from schedules_seeds import pool_seeds

        return pool_seeds([Path(d) for d in args.pool], out, Path(args.readme) if args.readme else None)
    if args.model_only:
        path = out / "bench" / "schedules.json"
        report = json.loads(path.read_text())
        report["machine_model"] = machine_model(out / "schedules" / "sync", report["runs"])
        path.write_text(json.dumps(report, indent=1) + "\n")
        print(json.dumps(report["machine_model"], indent=1))
        return 0
    stamp = args.stamp or time.strftime("%Y%m%d-%H%M%S")
    evals = [f"eval_every={args.eval_every}", f"data.eval_size={args.questions}", *args.override]
    modes = args.modes.split(",")
    unknown = sorted(set(modes) - set(MODES))
    if unknown or "sync" not in modes:
        raise SystemExit(f"--modes {args.modes}: unknown {unknown} (choose from {list(MODES)}; sync is the baseline)")
    if args.warm:
        ckpt = Path(args.warm)
    else:
        warm = launch(run_root, f"warm-{stamp}", "steps=0", *evals, "eval_before=false", placement=args.placement)
        ckpt = sorted((warm / "checkpoints").glob("step_*"))[-1] / "model"
    start = ["warm_start.steps=0", "model.source=hub", f"model.path={ckpt}", "model.name=warm"]
    start += [f"seed={args.seed}"] if args.seed is not None else []
    results, runs = {}, {}
    # the start model's evaluation is the same greedy run in every mode: sync's alone makes it
    sync = launch(run_root, f"sync-{stamp}", f"steps={args.steps}", *start, *evals, "eval_before=true",
                  placement=args.placement)
    runs["sync"] = sync
    results["sync"] = summarize(sync, None)
    sync_step = results["sync"]["rl_wall_s"] / results["sync"]["steps"]
    for name, extra in MODES.items():
        if name == "sync" or name not in modes:
            continue
        runs[name] = launch(run_root, f"{name}-{stamp}", f"steps={args.steps}", *start, *evals, "eval_before=false",
                            *extra, placement=args.placement)
        results[name] = summarize(runs[name], results["sync"]["rl_wall_s"])
        results[name]["speedup_steps_per_hour"] = results[name]["steps_per_hour"] / results["sync"]["steps_per_hour"]
    # equal steps: the evaluation at step N of every run against sync's, question by question
    final = f"step_{args.steps:06d}.jsonl"
    base = read_predictions(sync / "predictions" / final)
    for name, run in list(runs.items()):
        if name == "sync":
            continue
        results[name]["vs_sync_at_equal_steps"] = vs_sync(base, run / "predictions" / final)
        if args.equal_steps:
            continue
        # equal wall time: the same run stopped (or carried on) where sync's RL time ran out
        n = results[name]["steps_at_sync_wall_time"]
        if n != args.steps:
            runs[f"{name}_wall"] = launch(run_root, f"{name}-wall{n}-{stamp}", f"steps={n}", *start, *evals,
                                          "eval_before=false", *MODES[name], placement=args.placement)
        key = f"{name}_wall" if f"{name}_wall" in runs else name
        results[name]["vs_sync_at_equal_wall_time"] = {
            "steps": n, "run": key, **vs_sync(base, runs[key] / "predictions" / f"step_{n:06d}.jsonl")}
    recs = [r for r in K.read_metrics(sync / "metrics.jsonl") if r[K.KIND] == K.TRAIN and r.get("stage") != "sft"]
    results["sync"]["phase_s"] = {"rollout": sum(r.get("time/rollout/rollout_s", 0.0) for r in recs) / len(recs),
                                  "train": sum(r.get("time/trainer/train_s", 0.0) for r in recs) / len(recs)}
    report = {"steps": args.steps, "placement": args.placement, "seed": args.seed,
              "overrides": PLACEMENTS[args.placement] + args.override,
              "start_model": str(ckpt), "equal_steps_only": args.equal_steps,
              "seconds_per_sync_step": sync_step, "runs": results,
              "production_model": production_model(results["sync"], [m for m in MODES if m in modes]),
              "machine_model": machine_model(sync, results)}
    suffix = ("" if args.placement == "split" else f"_{args.placement}") + \
        (f"_s{args.seed}" if args.seed is not None else "")
    (out / "bench").mkdir(parents=True, exist_ok=True)
    (out / "bench" / f"schedules{suffix}.json").write_text(json.dumps(report, indent=1) + "\n")
    from searchr1.rundir import export

    for name, run in runs.items():
        export(run, out / f"schedules{suffix}" / name)
    print(json.dumps({n: {k: r.get(k) for k in ("steps_per_hour", "useful_work_fraction")} for n, r in results.items()},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
