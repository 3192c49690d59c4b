"""The schedules bench over seeds: every lag against `sync` of the same seed, question by question, then pooled.

Input: the exported folders of `bench/schedules.py` runs, one per seed, each holding `schedules.json` (or
`bench/schedules*.json`) and one folder per mode with its `predictions/step_N.jsonl` and `metrics.jsonl`.
Output: OUT/bench/schedules_seeds.json (per mode: EM per seed, paired test against sync per seed and pooled,
steps/hour and useful work per seed, importance weights), a markdown table on stdout, and
OUT/bench/schedules_seeds.png (EM and steps/hour against lag).

    python bench/schedules.py --pool results/placement/alternate_amx results/placement/alternate_amx_s1 ...
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from searchr1 import metrics as K  # noqa: E402
from searchr1.evaluation import read_predictions  # noqa: E402
from searchr1.stats import paired_predictions, pool, wilson  # noqa: E402

LAG = {"sync": 0, "pipelined_k1": 1, "pipelined_k2_ratio": 2, "pipelined_k2_decoupled": 2,
       "pipelined_k4_decoupled": 4, "pipelined_k8_decoupled": 8, "streaming_k2": 2,
       "streaming_k2_partial": 2}


def _report(folder: Path) -> dict:
    for path in [folder / "schedules.json", *sorted((folder / "bench").glob("schedules*.json"))]:
        if path.exists():
            return json.loads(path.read_text())
    raise SystemExit(f"{folder}: no schedules.json (an exported bench/schedules.py run is expected)")


def smallest_detectable_loss(n: int, discordant: int) -> float:
    """Points of EM that a paired test over n questions detects with 80% power at a two-sided 5% level, at the
    discordance observed (McNemar's normal approximation: (z_0.975 + z_0.8) * sqrt(psi / n), psi the share of
    questions that the two runs answer differently). Fewer discordant questions make a smaller loss visible."""
    psi = max(discordant, 1) / n
    return 100 * (1.959964 + 0.841621) * math.sqrt(psi / n)


BEGIN = ("<!-- schedules:begin (python bench/schedules.py --pool results/placement/alternate_amx "
         "results/placement/alternate_amx_s1 results/placement/alternate_amx_s2 --readme README.md) -->\n")
END = "<!-- schedules:end -->"
COMMITTED = ["results/placement/alternate_amx", "results/placement/alternate_amx_s1", "results/placement/alternate_amx_s2"]


def pool_seeds(folders: list[Path], out: Path, readme: Path | None = None) -> int:
    """Writes OUT/bench/schedules_seeds.json and .png, prints the table, and puts it in `readme`'s block."""
    result = pooled(folders)
    (out / "bench").mkdir(parents=True, exist_ok=True)
    (out / "bench" / "schedules_seeds.json").write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    plot(result, out / "bench" / "schedules_seeds.png")
    if readme is not None:
        from searchr1.study import replace_block

        replace_block(readme, BEGIN, END, table(result) + "\n")
    return 0


def pooled(folders: list[Path]) -> dict:
    """Every mode that every folder ran, per seed against its own seed's sync, and pooled over the seeds."""
    reports = {}
    for f in folders:
        rep = _report(f)
        seed = rep.get("seed")
        seed = 0 if seed is None else seed
        if seed in reports:
            raise SystemExit(f"{f}: seed {seed} given twice")
        reports[seed] = (f, rep)
    steps = {rep["steps"] for _, rep in reports.values()}
    if len(steps) != 1:
        raise SystemExit(f"the folders' benches ran different step counts: {sorted(steps)}")
    last = steps.pop()
    final = f"step_{last:06d}.jsonl"
    modes = [m for m in LAG if all(m in rep["runs"] for _, rep in reports.values())]
    # equal wall time where every seed's bench measured it (an older bench compared at equal steps only)
    walled = {m for m in modes if all("vs_sync_at_equal_wall_time" in rep["runs"][m] for _, rep in reports.values())}
    result = {"seeds": sorted(reports), "steps": last, "folders": [str(reports[s][0]) for s in sorted(reports)], "modes": {}}
    for mode in modes:
        per_seed, paired, paired_wall = [], [], []
        for seed in sorted(reports):
            folder, rep = reports[seed]
            run = rep["runs"][mode]
            preds = read_predictions(folder / mode / "predictions" / final)
            em = sum(bool(p["em"]) for p in preds)
            row = {"seed": seed, "em": em, "n": len(preds), "steps_per_hour": run["steps_per_hour"],
                   "speedup": run.get("speedup_steps_per_hour", 1.0),
                   "useful_work_fraction": run["useful_work_fraction"], "idle_s_per_step": run.get("idle_s_per_step"),
                   "importance_weights": run.get("importance_weights", {})}
            if mode == "sync":
                start = read_predictions(folder / "sync" / "predictions" / "step_000000.jsonl")
                p = paired_predictions(start, preds)
                row["vs_start"] = {"start": p.a_correct, "only_start": p.only_a, "only_end": p.only_b,
                                   "mcnemar_p": p.p_value}
            else:
                p = paired_predictions(read_predictions(folder / "sync" / "predictions" / final), preds)
                row["vs_sync"] = {"only_sync": p.only_a, "only_this": p.only_b, "mcnemar_p": p.p_value}
            if mode in walled:
                wall = run["vs_sync_at_equal_wall_time"]
                w = paired_predictions(read_predictions(folder / "sync" / "predictions" / final),
                                       read_predictions(folder / wall["run"] / "predictions" / f"step_{wall['steps']:06d}.jsonl"))
                row["at_sync_wall_time"] = {"steps": wall["steps"], "em": w.b_correct, "only_sync": w.only_a,
                                            "only_this": w.only_b, "mcnemar_p": w.p_value}
                if wall["run"] != mode:
                    row["at_sync_wall_time"]["repeats_first_run"] = repeats(folder / mode, folder / wall["run"])
                paired_wall.append(w)
            paired.append(p)
            per_seed.append(row)
        pooled = pool(paired)
        n = sum(r["n"] for r in per_seed)
        em = sum(r["em"] for r in per_seed)
        lo, hi = wilson(em, n)
        entry = {"lag": LAG[mode], "per_seed": per_seed, "em_total": em, "n_total": n,
                 "em_pct": 100 * em / n, "ci95": [100 * lo, 100 * hi],
                 "steps_per_hour_mean": sum(r["steps_per_hour"] for r in per_seed) / len(per_seed),
                 "speedup_mean": sum(r["speedup"] for r in per_seed) / len(per_seed),
                 "useful_work_fraction_mean": sum(r["useful_work_fraction"] for r in per_seed) / len(per_seed),
                 "pooled": {"only_a": pooled.only_a, "only_b": pooled.only_b, "p": pooled.p_value,
                            "runs_up": pooled.runs_up, "runs_down": pooled.runs_down,
                            "median_delta_points": pooled.median_delta_points}}
        if mode != "sync":
            # the loss the pooled test could have called, on all the seeds' questions together
            entry["smallest_detectable_loss_points"] = smallest_detectable_loss(n, pooled.only_a + pooled.only_b)
        if paired_wall:
            pw, em_w = pool(paired_wall), sum(r["at_sync_wall_time"]["em"] for r in per_seed)
            lo, hi = wilson(em_w, n)
            entry["at_sync_wall_time"] = {"em_total": em_w, "em_pct": 100 * em_w / n, "ci95": [100 * lo, 100 * hi],
                                          "pooled": {"only_a": pw.only_a, "only_b": pw.only_b, "p": pw.p_value},
                                          "smallest_detectable_loss_points":
                                              smallest_detectable_loss(n, pw.only_a + pw.only_b)}
        result["modes"][mode] = entry
    return result


REPEATED = ("rollout/reward", "rollout/searches", "train/loss", "train/grad_norm")


def repeats(first: Path, rerun: Path) -> dict:
    """Whether a rerun stopped early trained what the first run trained in the same steps: per step, the sampled
    reward and searches equal, the loss and gradient norm within float noise. Where it holds, the rerun's end is the first
    run's state at that step; where it does not (streaming: which weights a group starts under depends on when an
    update lands), the rerun is a second draw of the same schedule from the same start, still stopped at sync's
    wall time."""
    def steps(run):
        return {r[K.STEP]: r for r in K.read_metrics(run / "metrics.jsonl") if r[K.KIND] == K.TRAIN}
    a, b = steps(first), steps(rerun)
    worst = max((abs(a[s][k] - b[s][k]) / max(abs(a[s][k]), 1e-12) for s in b for k in REPEATED[2:]), default=0.0)
    differ = [s for s in sorted(b) if any(a[s][k] != b[s][k] for k in REPEATED[:2])]
    return {"steps": len(b), "samples_equal": not differ, "first_step_differing": differ[0] if differ else None,
            "max_rel_diff_loss_grad": worst, "holds": not differ and worst < 1e-3}


def same_path(at_wall: dict) -> str:
    r = at_wall.get("repeats_first_run")
    if r is None:
        return "not rerun"
    return "yes" if r["holds"] else f"parts at step {r['first_step_differing']}"


def table(result: dict) -> str:
    seeds = result["seeds"]
    head = ("| schedule | lag | EM at the last step, per seed | all seeds | vs sync: only sync / only this, per seed "
            "| pooled, p | smallest loss detectable | steps/hour vs sync | useful work |")
    lines = [head, "|" + "---|" * 9]
    for mode, e in result["modes"].items():
        ems = ", ".join(f"{r['em']}" for r in e["per_seed"])
        if mode == "sync":
            vs = "start " + ", ".join(f"{r['vs_start']['start']}" for r in e["per_seed"])
            pooled = f"vs start {e['pooled']['only_a']} / {e['pooled']['only_b']}, p = {e['pooled']['p']:.2g}"
            sdl = ""
        else:
            vs = ", ".join(f"{r['vs_sync']['only_sync']}/{r['vs_sync']['only_this']}" for r in e["per_seed"])
            pooled = f"{e['pooled']['only_a']} / {e['pooled']['only_b']}, p = {e['pooled']['p']:.2g}"
            sdl = f"{e['smallest_detectable_loss_points']:.1f} points"
        lines.append(f"| {mode} | {e['lag']} | {ems} (seeds {', '.join(map(str, seeds))}) | "
                     f"{e['em_total']}/{e['n_total']} ({e['em_pct']:.1f}%, {e['ci95'][0]:.1f}-{e['ci95'][1]:.1f}) | "
                     f"{vs} | {pooled} | {sdl} | {e['speedup_mean']:.2f}x | {e['useful_work_fraction_mean']:.2f} |")
    walled = {m: e for m, e in result["modes"].items() if "at_sync_wall_time" in e}
    if walled:
        lines += ["", "At equal wall time (each run stopped at the step it had completed when its seed's sync ended):", "",
                  "| schedule | lag | steps done in sync's RL time, per seed | EM then, per seed | all seeds | vs sync "
                  f"at step {result['steps']}: only sync / only this, per seed | pooled, p | smallest loss detectable "
                  "| rerun repeats the first run's steps, per seed |",
                  "|" + "---|" * 9]
        for mode, e in walled.items():
            w, rows = e["at_sync_wall_time"], [r["at_sync_wall_time"] for r in e["per_seed"]]
            vs = ", ".join(f"{r['only_sync']}/{r['only_this']}" for r in rows)
            lines.append(f"| {mode} | {e['lag']} | {', '.join(str(r['steps']) for r in rows)} | "
                         f"{', '.join(str(r['em']) for r in rows)} | "
                         f"{w['em_total']}/{e['n_total']} ({w['em_pct']:.1f}%, {w['ci95'][0]:.1f}-{w['ci95'][1]:.1f}) | "
                         f"{vs} | "
                         f"{w['pooled']['only_a']} / {w['pooled']['only_b']}, p = {w['pooled']['p']:.2g} | "
                         f"{w['smallest_detectable_loss_points']:.1f} points | {'; '.join(map(same_path, rows))} |")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for mode, e in result["modes"].items():
        marker = "s" if mode.startswith("streaming") else ("o" if mode != "sync" else "D")
        x = e["lag"] + {"streaming_k2": 0.15, "streaming_k2_partial": 0.35}.get(mode, 0.0)
        a.errorbar([x], [e["em_pct"]], yerr=[[e["em_pct"] - e["ci95"][0]], [e["ci95"][1] - e["em_pct"]]],
                   fmt=marker, capsize=3, label=mode)
        for r in e["per_seed"]:
            a.scatter([x + 0.3], [100 * r["em"] / r["n"]], s=8, color="grey")
        if "at_sync_wall_time" in e:  # hollow: the same schedule stopped where sync's time ran out
            a.scatter([x + 0.1], [e["at_sync_wall_time"]["em_pct"]], marker=marker, facecolors="none",
                      edgecolors="black", s=28)
        b.scatter([x], [e["speedup_mean"]], marker=marker, label=mode)
    a.set(xlabel="policy lag (versions)", ylabel="held-out EM, % (all seeds; grey: each seed)",
          title=f"EM at equal steps (hollow: equal wall time), seeds {result['seeds']}")
    b.axhline(1.0, color="grey", lw=0.5)
    b.set(xlabel="policy lag (versions)", ylabel="steps/hour vs sync (mean over seeds)", title="throughput")
    a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
