"""The dev split's levers side by side: each against the baseline run of the same seed and compute dtype.

The tuning runs (README, "Tuning, on the dev split only") are exported as `cpu_dev_<lever>_<dtype>_s<seed>` under
`results/tuning/`; one lever's name is the baseline's (`t1.0`: the experiment's settings). For every other lever
this module pairs, seed by seed and question by question on the 150 dev questions, RL's gain (the evaluation
where RL starts, after `warm_start.steps`, against the run's last) and the lever's end against the baseline's end,
and pools each over the seeds (searchr1.stats.pool). It reads only the exported files:

    python -m searchr1.levers results/tuning                      # the table, as the README shows it
    python -m searchr1.levers results/tuning --readme README.md   # and the README's block

A lever's overrides are the keys whose values differ from its baseline run's config; a key the baseline's config
lacks (added to the schema since, with a default that keeps what ran before) counts where the lever's value is
not the schema's default. "same start" says whether, in every seed, the evaluation where RL
starts scores each question as the baseline's does (the same warm start: RL's gains compare directly).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from searchr1.evaluation import read_predictions
from searchr1.stats import paired_predictions, pool
from searchr1.study import replace_block

NAME = re.compile(r"^cpu_dev_(?P<lever>.+)_(?P<dtype>bfloat16|float32)_s(?P<seed>\d+)$")
# what names a run, not what it changes; the dtype it computed in is in its name (`auto` and `bf16` may be the same)
IGNORED = {"run_name", "run_root", "seed", "trainer.compute_dtype", "engine.compute_dtype"}
PER_SEED = object()  # an override whose value differs from seed to seed (each seed's own file, e.g. its pass rates)


def begin(root: str) -> str:
    """The marker of the README block that `python -m searchr1.levers ROOT --readme` writes: one block per root (the
    dev split's runs on the study's CPU, and those made again on another CPU kind under results/tuning/cpus/<kind>,
    which pair only with the baseline runs of that kind: a bf16 product differs between kinds)."""
    return f"<!-- levers:begin (python -m searchr1.levers {root}) -->\n"


BEGIN, END = begin("results/tuning"), "<!-- levers:end -->"


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _config(run: Path) -> dict:
    from omegaconf import OmegaConf

    return _flat(OmegaConf.to_container(OmegaConf.load(run / "config.yaml")))


def schema_defaults() -> dict:
    """Every key's default in the config schema (searchr1.config.Config), flattened like a run's config."""
    from omegaconf import OmegaConf

    from searchr1.config import Config

    return _flat(OmegaConf.to_container(OmegaConf.structured(Config)))


def overrides(base: dict, other: dict, defaults: dict | None = None) -> dict:
    """The keys whose values differ, with `other`'s value: those both configs hold, and those only `other` holds
    whose value is not the schema's default (`defaults`; the baseline ran with that default). The collapse
    monitor's keys count only where it acts: under trainer.on_collapse=warn it writes flags and changes nothing
    trained."""
    defaults = schema_defaults() if defaults is None else defaults
    both = base.keys() & other.keys() - IGNORED
    keys = both | {k for k in other.keys() - base.keys() - IGNORED if k in defaults and other[k] != defaults[k]}
    if base.get("trainer.on_collapse") == other.get("trainer.on_collapse") == "warn":
        keys = {k for k in keys if not k.startswith("monitor.")}
    return {k: other[k] for k in sorted(keys) if k not in both or base[k] != other[k]}


def _evals(run: Path, cfg: dict) -> tuple[list[dict], list[dict], int]:
    """The evaluation where RL starts (after the warm start's last step; a run evaluated earlier too, every few
    steps, has files before it), the last one, and the last one's step."""
    files = sorted((run / "predictions").glob("step_*.jsonl"))
    if len(files) < 2:
        raise ValueError(f"{run}: a tuning run needs two dev evaluations, found {len(files)} prediction files")
    start = run / "predictions" / f"step_{cfg.get('warm_start.steps', 0):06d}.jsonl"
    return read_predictions(start if start in files else files[0]), read_predictions(files[-1]), \
        int(files[-1].stem.split("_")[1])


def levers(root: str | Path, baseline: str = "t1.0") -> list[dict]:
    """One row per lever with runs paired to the baseline's (same seed and dtype), in name order."""
    runs: dict[tuple[str, str], dict[int, Path]] = {}
    for p in sorted(Path(root).iterdir()):
        m = NAME.match(p.name)
        if m and (p / "config.yaml").is_file() and (p / "predictions").is_dir():
            runs.setdefault((m["lever"], m["dtype"]), {})[int(m["seed"])] = p
    read: dict[Path, tuple] = {}  # a baseline run pairs with every lever: read each run once
    defaults = schema_defaults()

    def load(run: Path) -> tuple:
        if run not in read:
            cfg = _config(run)
            read[run] = (cfg, *_evals(run, cfg))
        return read[run]

    rows = []
    for (lever, dtype), seeds in sorted(runs.items()):
        if lever == baseline:
            continue
        base = runs.get((baseline, dtype), {})
        paired = sorted(s for s in seeds if s in base)
        if not paired:  # e.g. a dtype the baseline was not run in
            rows.append({"lever": lever, "dtype": dtype, "seeds": [], "runs": len(seeds)})
            continue
        gains, ends, base_gains, same, seen = [], [], [], True, {}
        for s in paired:
            (bc, b0, b1, b_step), (lc, l0, l1, l_step) = load(base[s]), load(seeds[s])
            gains.append(paired_predictions(l0, l1))
            base_gains.append(paired_predictions(b0, b1))
            ends.append(paired_predictions(b1, l1))
            same &= [(x["id"], x["em"]) for x in l0] == [(x["id"], x["em"]) for x in b0]
            for k, v in overrides(bc, lc, defaults).items():
                seen.setdefault(k, []).append(v)
        over = {k: vs[0] if all(v == vs[0] for v in vs) else PER_SEED for k, vs in seen.items()}
        rows.append({"lever": lever, "dtype": dtype, "seeds": paired, "overrides": over, "same_start": same,
                     "n": gains[0].n, "end_step": l_step, "baseline_end_step": b_step,
                     "dev_em": [f"{g.a_correct} -> {g.b_correct}" for g in gains],
                     "baseline_dev_em": [f"{g.a_correct} -> {g.b_correct}" for g in base_gains],
                     "gain": pool(gains), "end_vs_baseline": pool(ends)})
    return rows


def markdown(rows: list[dict], baseline: str = "t1.0") -> str:
    """The levers' table, as the README shows it (regenerated from the exported files, never edited)."""
    out = [f"| lever (`cpu_dev_<lever>_<dtype>_s<seed>`) | overrides against `{baseline}` | seeds | same start | "
           f"dev EM where RL starts -> end | `{baseline}` on those seeds | RL's gain pooled: gained / lost, p, median "
           f"| end against `{baseline}`'s end: only the lever's / only `{baseline}`'s, p |",
           "|---|---|---|---|---|---|---|---|"]
    for r in (r for r in rows if r["seeds"]):
        g, e = r["gain"], r["end_vs_baseline"]
        over = ", ".join(f"`{k}` (one per seed)" if v is PER_SEED else f"`{k}={v}`"
                         for k, v in r["overrides"].items()) or "-"
        end = "" if r["end_step"] == r["baseline_end_step"] else f" (end: step {r['end_step']})"
        out.append(f"| `{r['lever']}` ({r['dtype']}) | {over} | {', '.join(map(str, r['seeds']))} | "
                   f"{'yes' if r['same_start'] else 'no'} | {', '.join(r['dev_em'])} of {r['n']}{end} | "
                   f"{', '.join(r['baseline_dev_em'])} | {g.only_b} / {g.only_a}, p = {g.p_value:.2g}, "
                   f"{g.median_delta_points:+.1f} points | {e.only_b} / {e.only_a}, p = {e.p_value:.2g} |")
    alone = [f"`{r['lever']}` ({r['dtype']}, {r['runs']} run{'s' * (r['runs'] > 1)})" for r in rows if not r["seeds"]]
    if alone:
        out += ["", f"Without a `{baseline}` run of their seed and dtype to pair with: {', '.join(alone)}."]
    return "\n".join(out) + "\n"


def _cli(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m searchr1.levers", description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="the folder of exported tuning runs (results/tuning)")
    ap.add_argument("--baseline", default="t1.0", help="the lever name of the baseline runs")
    ap.add_argument("--readme", help=f"also replace the table between {begin('ROOT').strip()} and {END} in this file")
    args = ap.parse_args(argv)
    table = markdown(levers(args.root, args.baseline), args.baseline)
    if args.readme:
        replace_block(args.readme, begin(args.root.rstrip("/")), END, table)
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(_cli())
