"""The main study: RL's held-out gain across seeds and compute dtypes, its controls, and the pooled tests.

`make results` runs the CPU experiment for each seed and compute dtype of the study, the flipped-sign control and
evaluations of one end checkpoint (without search; without the held-out questions' passages), exports every run
into `results/` (searchr1.rundir.export), and then this module, which reads only those exported files:

    python -m searchr1.study results                 # the tables, as the README shows them
    python -m searchr1.study results --json results/study.json --readme README.md   # and the README's block
    python -m searchr1.study results/cpus/KIND --against results    # runs made on another CPU kind, and each
                                                  # beside the study's run of the same name, question by question

A training run's gain is its first held-out evaluation (where RL starts) against its last, question by question
(exact McNemar). Runs pool two ways (searchr1.stats.pool): the exact stratified test over all their discordant
questions, and a sign test over runs. An evaluation-only run is compared with the last evaluation of the run its
checkpoint came from.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from dataclasses import asdict
from pathlib import Path

from searchr1 import metrics as K
from searchr1.evaluation import read_predictions
from searchr1.stats import Paired, paired_predictions, pool, wilson

MAIN_P, MEDIAN_GAIN, POOLED_P = 0.05, 10.0, 1e-4  # what the study must show (issue 24's acceptance)
BEGIN, END = "<!-- study:begin (python -m searchr1.study results) -->\n", "<!-- study:end -->"  # the README's block
# the block of the main job made again on another CPU kind (`make results-cpus`), and the kind its marker names
CPUS_KIND = "x86_64-avx2-avx512_bf16-avx512f"


def cpus_begin(root: str, against: str) -> str:
    """The marker of the README block that `python -m searchr1.study ROOT --against AGAINST` writes."""
    return f"<!-- cpus:begin (python -m searchr1.study {root} --against {against}) -->\n"


CPUS_BEGIN, CPUS_END = cpus_begin(f"results/cpus/{CPUS_KIND}", "results"), "<!-- cpus:end -->"


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _config(run: Path) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(run / "config.yaml"))


def _minutes(status: dict) -> float | None:
    if not status.get("started_at") or not status.get("ended_at"):
        return None
    start, end = (datetime.datetime.fromisoformat(status[k]) for k in ("started_at", "ended_at"))
    return round((end - start).total_seconds() / 60, 1)


def _dtype(run: Path, cfg: dict) -> str:
    """What the run computed in, as its record says (compute_dtype=auto is decided per machine)."""
    rec = _json(run / "summary.json").get("compute_dtype") or {}
    found = {rec.get("trainer"), rec.get("engine")} - {None}
    if not found:  # an evaluation-only run names its engine's
        found = {_json(run / "eval_summary.json").get("compute_dtype")} - {None}
    if not found:
        found = {cfg["trainer"]["compute_dtype"], cfg["engine"]["compute_dtype"]}
    return "+".join(sorted(found))


def _evaluations(run: Path) -> list[Path]:
    """A training run's held-out prediction files, in step order."""
    return sorted((run / "predictions").glob("step_*.jsonl"))


def _step(predictions: Path) -> int:
    return int(predictions.stem.split("_")[1])


def training_run(run: Path) -> dict:
    cfg = _config(run)
    preds = _evaluations(run)
    if len(preds) < 2:
        raise ValueError(f"{run}: a training run needs two held-out evaluations, found {len(preds)} prediction files")
    first, last = read_predictions(preds[0]), read_predictions(preds[-1])
    r = paired_predictions(first, last)
    evals = [e for e in K.read_metrics(run / "metrics.jsonl") if e[K.KIND] == K.EVAL]
    return {"run": run.name, "kind": "control" if cfg["reward"]["scale"] < 0 else "main", "seed": cfg["seed"],
            "dtype": _dtype(run, cfg), "start_step": _step(preds[0]),
            "end_step": _step(preds[-1]), **asdict(r), "delta_points": r.delta_points,
            "searches_before": evals[0][K.EVAL_SEARCHES] if evals else None,
            "searches_after": evals[-1][K.EVAL_SEARCHES] if evals else None,
            "minutes": _minutes(_json(run / "status.json")), "run_name": cfg.get("run_name", "")}


def evaluation_run(run: Path, bases: dict[str, Path]) -> dict:
    cfg, summary = _config(run), _json(run / "eval_summary.json")
    ckpt = Path(cfg.get("checkpoint") or "")
    base_name = ckpt.parent.parent.name if ckpt.parent.name == "checkpoints" else ""
    row = {"run": run.name, "kind": "eval", "seed": cfg["seed"], "dtype": _dtype(run, cfg),
           "em_count": summary.get("em_count"), "n": summary.get("n"), "checkpoint": ckpt.name or None,
           "base": None, "minutes": _minutes(_json(run / "status.json")),
           "searches": summary.get("searches_per_question")}
    base = bases.get(base_name)
    if base is not None:
        last = _evaluations(base)[-1]
        r = paired_predictions(read_predictions(last), read_predictions(run / "predictions.jsonl"))
        row.update(base=base.name, base_step=_step(last), **{f"vs_base_{k}": v for k, v in asdict(r).items()})
    return row


def study(root: str | Path) -> dict:
    """Every exported run under `root`, its paired test, and the pooled tests of the main runs per dtype."""
    root = Path(root)
    runs = sorted(p for p in root.iterdir() if (p / "config.yaml").is_file())
    trained = [training_run(p) for p in runs if (p / "metrics.jsonl").is_file() and (p / "predictions").is_dir()]
    bases = {r["run_name"]: root / r["run"] for r in trained if r["run_name"]}
    evaluated = [evaluation_run(p, bases) for p in runs if (p / "eval_summary.json").is_file()]
    main = [r for r in trained if r["kind"] == "main"]
    groups = {d: [r for r in main if r["dtype"] == d] for d in sorted({r["dtype"] for r in main})}
    if len(groups) > 1:
        groups["all"] = main
    pooled = {}
    for name, rows in groups.items():
        p = pool([_paired(r) for r in rows])
        pooled[name] = {**asdict(p), "criteria": {
            f"every run p < {MAIN_P}": all(r["p_value"] < MAIN_P for r in rows),
            f"median gain >= {MEDIAN_GAIN:g} points": p.median_delta_points >= MEDIAN_GAIN,
            f"pooled p < {POOLED_P:g}": p.p_value < POOLED_P}}
    controls = [r for r in trained if r["kind"] == "control"]
    minutes = [r["minutes"] for r in trained + evaluated if r["minutes"] is not None]
    return {"runs": trained, "evaluations": evaluated, "pooled": pooled,
            "control_does_not_rise": all(r["b_correct"] <= r["a_correct"] for r in controls) if controls else None,
            "cost_minutes": round(sum(minutes), 1), "runs_timed": len(minutes)}


def replication(root: str | Path, other: str | Path) -> list[dict]:
    """Each training run under `root` beside the run of the same name under `other` (the same seed, dtype and
    configuration, made on another machine): where RL starts and where it ends, question by question, and how many
    of the responses are the same text. A run `other` lacks is left out."""
    rows = []
    for run in sorted(Path(root).iterdir()):
        twin = Path(other) / run.name
        if not (run / "predictions").is_dir() or not (twin / "predictions").is_dir():
            continue
        here, there = _evaluations(run), _evaluations(twin)
        if len(here) < 2 or [p.name for p in (here[0], here[-1])] != [p.name for p in (there[0], there[-1])]:
            raise ValueError(f"{run} and {twin}: their first and last held-out evaluations are not at the same steps "
                             f"({[p.name for p in here]} against {[p.name for p in there]})")
        row = {"run": run.name, "other": str(twin)}
        for point, (a, b) in (("start", (here[0], there[0])), ("end", (here[-1], there[-1]))):
            mine, theirs = read_predictions(a), read_predictions(b)
            text = {q["id"]: q.get("response") for q in theirs}
            # paired as (there, here): only_a is right only there, only_b right only here
            row[point] = asdict(paired_predictions(theirs, mine))
            row[f"{point}_same_responses"] = sum(q.get("response") == text.get(q["id"]) for q in mine)
            row[f"{point}_step"] = _step(a)
        rows.append(row)
    return rows


def markdown_replication(rows: list[dict], other: str) -> str:
    out = [f"| run | here: where RL starts -> end | `{other}`: start -> end | start: only here / only there, p | "
           "end: only here / only there, p | responses the same text (start, end) |", "|---|---|---|---|---|---|"]
    for r in rows:
        s, e = r["start"], r["end"]
        out.append(f"| `{r['run']}` | {s['b_correct']} -> {e['b_correct']} of {e['n']} | {s['a_correct']} -> "
                   f"{e['a_correct']} | {s['only_b']} / {s['only_a']}, p = {s['p_value']:.2g} | {e['only_b']} / "
                   f"{e['only_a']}, p = {e['p_value']:.2g} | {r['start_same_responses']}, {r['end_same_responses']} "
                   f"of {e['n']} |")
    if rows:
        p = pool([Paired(**r["end"]) for r in rows])
        out += ["", f"Ends pooled over the {p.runs} runs: {p.only_b} right only here, {p.only_a} only in "
                    f"`{other}` (exact stratified p = {p.p_value:.2g}); ends higher here in {p.runs_up}, lower in "
                    f"{p.runs_down}."]
    return "\n".join(out) + "\n"


def _paired(row: dict) -> Paired:
    return Paired(row["n"], row["a_correct"], row["b_correct"], row["only_a"], row["only_b"], row["p_value"])


def _pct(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k}/{n} ({100 * k / n:.1f}%, {100 * lo:.1f}-{100 * hi:.1f})"


def markdown(s: dict) -> str:
    """The study's tables, as the README shows them (regenerated from the exported files, never edited)."""
    out = ["| run | dtype | seed | where RL starts | after RL | gained / lost | exact McNemar p | searches / question |"
           " minutes |", "|---|---|---|---|---|---|---|---|---|"]
    for r in s["runs"]:
        out.append(f"| `{r['run']}`{' (control: reward x -1)' if r['kind'] == 'control' else ''} | {r['dtype']} | "
                   f"{r['seed']} | {_pct(r['a_correct'], r['n'])} at step {r['start_step']} | "
                   f"{_pct(r['b_correct'], r['n'])} at step {r['end_step']} | {r['only_b']} / {r['only_a']} | "
                   f"{r['p_value']:.2g} | {r['searches_before']:.2f} -> {r['searches_after']:.2f} | "
                   f"{r['minutes'] if r['minutes'] is not None else '-'} |")
    out += ["", "| main runs pooled | runs | gained / lost | stratified exact p | runs up / down | sign-test p | "
            "median gain (points) |", "|---|---|---|---|---|---|---|"]
    for name, p in s["pooled"].items():
        out.append(f"| {name} | {p['runs']} | {p['only_b']} / {p['only_a']} | {p['p_value']:.2g} | "
                   f"{p['runs_up']} / {p['runs_down']} | {p['sign_p_value']:.2g} | {p['median_delta_points']:+.1f} |")
    if s["evaluations"]:
        out += ["", "| evaluation of an end checkpoint | dtype | EM | searches / question | vs its run's last "
                "evaluation (only there / only here, p) |", "|---|---|---|---|---|"]
        for e in s["evaluations"]:
            vs = (f"`{e['base']}` step {e['base_step']}: {e['vs_base_only_a']} / {e['vs_base_only_b']}, "
                  f"p = {e['vs_base_p_value']:.2g}") if e["base"] else "-"
            out.append(f"| `{e['run']}` | {e['dtype']} | {_pct(e['em_count'], e['n'])} | {e['searches']:.2f} | {vs} |")
    crit = [f"{name}: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in p["criteria"].items())
            for name, p in s["pooled"].items()]
    control = {None: "no control run", True: "yes", False: "NO"}[s["control_does_not_rise"]]
    out += ["", f"Criteria - {'; '.join(crit)}; the control does not rise: {control}. Cost: "
                f"{s['cost_minutes']} minutes of wall time over {s['runs_timed']} timed runs."]
    return "\n".join(out) + "\n"


def replace_block(path: str | Path, begin: str, end: str, text: str) -> None:
    """Replace what lies between the markers `begin` and `end` in the file at `path` (a README's generated table):
    the one writer of generated README blocks (the study's, transfer's, levers' and the benches')."""
    readme = Path(path).read_text()
    if begin not in readme or end not in readme:
        raise SystemExit(f"{path}: no block ({begin.strip()} ... {end}) to replace")
    head, rest = readme.split(begin, 1)
    Path(path).write_text(head + begin + text + end + rest.split(end, 1)[1])


def _cli(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m searchr1.study", description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="the folder of exported runs (results/)")
    ap.add_argument("--json", help="also write the study as JSON here")
    ap.add_argument("--readme", help=f"also replace the tables between {BEGIN.strip()} and {END} in this file "
                                     "(with --against, the block whose marker names the same command)")
    ap.add_argument("--against", help="a folder of exported runs (results/): each run beside its namesake there")
    args = ap.parse_args(argv)
    s = study(args.root)
    text, begin, end = markdown(s), BEGIN, END
    if args.against:
        s["replication"] = replication(args.root, args.against)
        text += "\n" + markdown_replication(s["replication"], args.against)
        begin, end = cpus_begin(args.root, args.against), CPUS_END
    if args.json:
        Path(args.json).write_text(json.dumps(s, indent=1) + "\n")
    if args.readme:
        replace_block(args.readme, begin, end, text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(_cli())
