"""Does the search skill transfer? Every evaluation set of the study's training runs, where RL starts and after
it, and each end checkpoint's evaluations (search disabled, a training mix) on the same sets.

Reads only exported runs (searchr1.rundir.export): a training run's `predictions/step_N.jsonl` (HotpotQA) and
`predictions/<set>/step_N.jsonl` (each other set of `data.eval_sets`); an evaluation run's `predictions.jsonl`
and `predictions_<set>.jsonl`, tied to the training run its checkpoint came from.

    python -m searchr1.transfer results --readme README.md   # the table, and the README's block
    python -m searchr1.transfer results/datasets --against results/t0.5/cpu_main_float32_s0 --readme README.md
                                          # each run's table, then its last evaluations paired with another run's
"""
from __future__ import annotations

import argparse
from pathlib import Path

from searchr1.evaluation import read_predictions
from searchr1.stats import paired_predictions, wilson
from searchr1.study import _config, replace_block

BEGIN, END = "<!-- sets:begin (python -m searchr1.transfer results) -->\n", "<!-- sets:end -->"
# the block of the training mix's comparison (`--against`), and the run its marker names (the study at
# temperature 0.5, seed 0, the mix's own temperature and seed)
MIX_AGAINST = "results/t0.5/cpu_main_float32_s0"
MIX_BEGIN = f"<!-- mix:begin (python -m searchr1.transfer results/datasets --against {MIX_AGAINST}) -->\n"
MIX_END = "<!-- mix:end -->"
TITLES = {"hotpotqa": "HotpotQA", "2wiki": "2WikiMultihopQA", "musique": "MuSiQue-Ans", "nq": "NQ-open"}


def _files(run: Path, name: str) -> list[Path]:
    folder = run / "predictions" if name == "hotpotqa" else run / "predictions" / name
    return sorted(folder.glob("step_*.jsonl"))


def _eval_file(run: Path, name: str) -> Path:
    return run / ("predictions.jsonl" if name == "hotpotqa" else f"predictions_{name}.jsonl")


def _em(preds: list[dict]) -> str:
    k, n = int(sum(p["em"] for p in preds)), len(preds)
    lo, hi = wilson(k, n)
    return f"{k}/{n} ({100 * k / n:.1f}%, {100 * lo:.1f}-{100 * hi:.1f})"


def _f1(preds: list[dict]) -> float:
    return sum(p["f1"] for p in preds) / max(len(preds), 1)


def rows(root: str | Path) -> list[dict]:
    """One row per (training run with other sets, set): its first and last evaluation, the paired test, and
    each evaluation run of its end checkpoint on that set."""
    root = Path(root)
    runs = sorted(p for p in root.iterdir() if (p / "config.yaml").is_file())
    evals = [p for p in runs if (p / "eval_summary.json").is_file()]
    out = []
    for run in runs:
        cfg = _config(run)
        sets = cfg["data"].get("eval_sets", ["hotpotqa"])
        if len(sets) < 2 or not (run / "predictions").is_dir():
            continue
        mine = [e for e in evals  # tied by the name the run had when its checkpoint was written
                if Path(_config(e).get("checkpoint") or "").parent.parent.name in (run.name, cfg.get("run_name"))]
        for name in sets:
            files = _files(run, name)
            if len(files) < 2:
                raise ValueError(f"{run}: {name} needs two evaluations, found {len(files)} prediction files")
            first, last = read_predictions(files[0]), read_predictions(files[-1])
            r = paired_predictions(first, last)
            row = {"run": run.name, "set": name, "start": _em(first), "end": _em(last), "gained": r.only_b,
                   "lost": r.only_a, "p": r.p_value, "f1": (_f1(first), _f1(last)),
                   "steps": (int(files[0].stem[5:]), int(files[-1].stem[5:])), "evals": {}}
            for e in mine:
                if _eval_file(e, name).is_file():
                    preds = read_predictions(_eval_file(e, name))
                    vs = paired_predictions(last, preds)
                    row["evals"][e.name] = f"{_em(preds)}; {vs.only_a} / {vs.only_b}, p = {vs.p_value:.2g}"
            out.append(row)
    return out


def markdown(table: list[dict]) -> str:
    names = sorted({e for r in table for e in r["evals"]})
    head = ["| run | set | where RL starts (EM, 95% CI) | after RL | gained / lost | exact McNemar p | F1 |"
            + "".join(f" `{n}` (vs after RL: only there / only here) |" for n in names),
            "|---|---|---|---|---|---|---|" + "---|" * len(names)]
    for r in table:
        head.append(f"| `{r['run']}` | {TITLES.get(r['set'], r['set'])} | {r['start']} at step {r['steps'][0]} | "
                    f"{r['end']} at step {r['steps'][1]} | {r['gained']} / {r['lost']} | {r['p']:.2g} | "
                    f"{r['f1'][0]:.3f} -> {r['f1'][1]:.3f} |" + "".join(f" {r['evals'].get(n, '-')} |" for n in names))
    return "\n".join(head) + "\n"


def against(root: str | Path, other: str | Path) -> list[dict]:
    """Each training run under `root` against the training run `other`, set by set, at their last evaluations:
    the same questions, so a paired test (two recipes' end checkpoints, e.g. a training mix against HotpotQA
    alone)."""
    other, out = Path(other), []
    for row in rows(root):
        files, theirs = _files(Path(root) / row["run"], row["set"]), _files(other, row["set"])
        if not theirs:
            continue
        mine, base = read_predictions(files[-1]), read_predictions(theirs[-1])
        r = paired_predictions(base, mine)
        out.append({"run": row["run"], "set": row["set"], "other": other.name, "other_end": _em(base),
                    "end": row["end"], "only_other": r.only_a, "only_run": r.only_b, "p": r.p_value,
                    "f1": (_f1(base), _f1(mine)), "own": f"{row['start']} -> {row['end'].split(' ')[0]}, "
                                                       f"{row['gained']} / {row['lost']}, p = {row['p']:.2g}"})
    return out


def markdown_against(table: list[dict]) -> str:
    head = ["| run | set | its own gain (start -> end, gained / lost, p) | its end | the other run's end | "
            "only the other / only this run | exact McNemar p | F1, other -> this |",
            "|---|---|---|---|---|---|---|---|"]
    for r in table:
        head.append(f"| `{r['run']}` vs `{r['other']}` | {TITLES.get(r['set'], r['set'])} | {r['own']} | {r['end']} | "
                    f"{r['other_end']} | {r['only_other']} / {r['only_run']} | {r['p']:.2g} | "
                    f"{r['f1'][0]:.3f} -> {r['f1'][1]:.3f} |")
    return "\n".join(head) + "\n"


def _cli(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m searchr1.transfer", description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="the folder of exported runs (results/)")
    ap.add_argument("--readme", help=f"also replace the table between {BEGIN.strip()} and {END} in this file "
                                     "(with --against, the mix block's)")
    ap.add_argument("--against", help="a training run whose last evaluations each run's are paired with")
    args = ap.parse_args(argv)
    if args.against:
        text = markdown_against(against(args.root, args.against))
        begin, end = MIX_BEGIN, MIX_END
    else:
        text, begin, end = markdown(rows(args.root)), BEGIN, END
    if args.readme:
        replace_block(args.readme, begin, end, text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(_cli())
