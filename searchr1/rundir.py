"""The run folder: one per run, never reused.

Layout:
  config.yaml        the resolved config (what every rank reads back)
  git.json           commit, dirty flag, branch
  submit.sbatch      the generated Slurm script (Slurm backend)
  logs/rank{R}.log   one log per rank
  metrics.jsonl      one line per step (and per evaluation), written by rank 0 (searchr1/metrics.py)
  progress.log       one line per step and per evaluation batch: what the console shows
  predictions/       held-out predictions per evaluation
  checkpoints/       trainer checkpoints; `latest` names the newest complete one (searchr1/checkpoint.py)
  status.json        how the job ended (backend)
"""
from __future__ import annotations

import datetime
import json
import os
import subprocess
from pathlib import Path

from omegaconf import OmegaConf

from searchr1.config import Config, from_dict

REPO_ROOT = Path(__file__).resolve().parent.parent


def git_state(root: Path = REPO_ROOT) -> dict:
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    commit = git("rev-parse", "HEAD")
    return {"commit": commit or None, "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "branch": git("rev-parse", "--abbrev-ref", "HEAD") or None}


def config_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def create(cfg: Config) -> Path:
    """A new folder under cfg.run_root; a name that exists gets a numeric suffix, so nothing is overwritten."""
    root = Path(cfg.run_root)
    root.mkdir(parents=True, exist_ok=True)
    base = cfg.run_name or f"{datetime.datetime.now():%Y-%m-%d_%H-%M-%S}_{cfg.experiment}"
    for n in range(10_000):
        path = root / (base if n == 0 else f"{base}-{n}")
        try:
            path.mkdir()
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"{root}/{base}: too many runs with this name")
    (path / "logs").mkdir()
    (path / "config.yaml").write_text(config_yaml(cfg))
    (path / "git.json").write_text(json.dumps(git_state(), indent=1) + "\n")
    if cfg.mode == "train" and cfg.curriculum.rl == "pass_rate":  # what RL's pool was drawn from, kept with the run
        import shutil

        rates = Path(cfg.curriculum.pass_rates).expanduser()
        shutil.copy2(rates, path / "pass_rates.jsonl")
        if rates.with_name("pass_rate_summary.json").is_file():  # the measurement's own record, where it lies
            shutil.copy2(rates.with_name("pass_rate_summary.json"), path / "pass_rate_summary.json")
    return path.resolve()


def load_config(run_dir: str | Path) -> Config:
    return from_dict(OmegaConf.to_container(OmegaConf.load(Path(run_dir) / "config.yaml")))


def progress(run_dir: Path, line: str) -> None:
    """Append one line to the run's progress log (any rank; one write of a short line is atomic)."""
    stamp = datetime.datetime.now().strftime("%H:%M:%S")
    with open(Path(run_dir) / "progress.log", "a", encoding="utf-8") as f:
        f.write(f"{stamp} {line}\n")


def utc_now() -> str:
    """The timestamp status.json records (started_at, ended_at)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def write_atomic(path: Path, text: str) -> None:
    """Write through a temporary name in the same folder, then rename: a reader (another rank, a joining worker,
    a test polling the run) sees the old file or the new one, never half of either. The temporary name carries
    the writer's pid, so that two writers never share one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_status(run_dir: Path, **fields) -> None:
    """Merge fields into status.json."""
    path = Path(run_dir) / "status.json"
    status = json.loads(path.read_text()) if path.exists() else {}
    status.update(fields)
    write_atomic(path, json.dumps(status, indent=1) + "\n")


LIGHT = ("config.yaml", "git.json", "data.json", "metrics.jsonl", "summary.json", "status.json", "submit.sbatch",
         "predictions.jsonl", "eval_summary.json",  # a mode=eval run
         "pass_rates.jsonl", "pass_rate_summary.json")  # a mode=pass_rate run (the first also a run that read one)


def export(run_dir: str | Path, dest: str | Path) -> Path:
    """Copy a run's small files (no checkpoints, no wandb) into `dest` and write a README with its numbers:
    what `results/` holds for each reference run."""
    import shutil

    from searchr1.metrics import read_metrics

    run_dir, dest = Path(run_dir), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name in LIGHT:
        if (run_dir / name).exists():
            shutil.copy2(run_dir / name, dest / name)
    for path in run_dir.glob("predictions_*.jsonl"):  # a mode=eval run's other evaluation sets
        shutil.copy2(path, dest / path.name)
    if (run_dir / "predictions").is_dir():
        shutil.copytree(run_dir / "predictions", dest / "predictions", dirs_exist_ok=True)
    (dest / "logs").mkdir(exist_ok=True)
    shutil.copy2(run_dir / "logs" / "rank0.log", dest / "logs" / "rank0.log")
    if not (run_dir / "metrics.jsonl").exists():  # a mode=eval or pass_rate run: its summary is the whole story
        rates = (run_dir / "pass_rate_summary.json").exists()
        what, name = (("Pass rates (`mode=pass_rate`)", "pass_rate_summary.json") if rates
                      else ("Held-out evaluation (`mode=eval`)", "eval_summary.json"))
        summary = json.loads((run_dir / name).read_text())
        rows = "\n".join(f"| {k} | {v} |" for k, v in summary.items() if not isinstance(v, (dict, list)))
        (dest / "README.md").write_text(f"# {run_dir.name}\n\n{what}, `{name}`:\n\n| field | value |\n|---|---|\n"
                                        f"{rows}\n")
        return dest
    records = read_metrics(run_dir / "metrics.jsonl")
    (dest / "README.md").write_text(summary_markdown(load_config(run_dir), records, run_dir.name))
    return dest


def summary_markdown(cfg: Config, records: list[dict], name: str) -> str:
    from searchr1 import metrics as K

    train = [r for r in records if r.get(K.KIND) == K.TRAIN]
    evals = [r for r in records if r.get(K.KIND) == K.EVAL]

    def mean(key, rows=train):
        vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        return sum(vals) / len(vals) if vals else float("nan")

    lines = [f"# {name}", "",
             f"`python launch.py +experiment={cfg.experiment}` (sync={cfg.sync.method}, schedule={cfg.schedule.name}) "
             f"- model {cfg.model.name}, {cfg.cluster.trainer_ranks} trainer + {cfg.cluster.rollout_ranks} rollout "
             f"ranks ({cfg.cluster.backend}), {cfg.steps} steps of {cfg.algo.questions_per_step} questions x "
             f"{cfg.algo.group_size} samples, engine {cfg.engine.name}. Numbers below are read from `metrics.jsonl`.",
             "", "## Held-out evaluation", "",
             "| after step | EM | EM % | F1 | searched | searches/question |", "|---|---|---|---|---|---|"]
    lines += [f"| {e[K.STEP]} | {e[K.EVAL_EM_COUNT]}/{e[K.EVAL_N]} | {100 * e[K.EVAL_EM]:.1f} | {e[K.EVAL_F1]:.3f} | "
              f"{100 * e.get(K.EVAL_SEARCHED_RATE, float('nan')):.0f}% | {e[K.EVAL_SEARCHES]:.2f} |" for e in evals]
    lines += ["", "## Per step (mean over steps)", "", "| metric | value |", "|---|---|"]
    rows = [("seconds per step", mean(K.STEP_S)), ("reward", mean(K.REWARD)),
            ("searches per trajectory", mean(K.SEARCHES)), ("weight bytes broadcast per step", mean(K.SYNC_BYTES)),
            ("bytes of a full export", mean(K.SYNC_FULL_BYTES)), ("changed fraction", mean(K.SYNC_CHANGED_FRAC)),
            ("useful-work fraction", mean(K.USEFUL_FRACTION))]
    rows += [(f"{k[5:-2]} s (mean over the role's ranks)", mean(k))
             for k in sorted({k for r in train for k in r if k.startswith("time/") and k.endswith("_s")})
             if k != K.STEP_S]
    lines += [f"| {k} | {v:.4g} |" for k, v in rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 4 or sys.argv[1] != "export":
        sys.exit("usage: python -m searchr1.rundir export RUN_DIR DEST")
    print(export(sys.argv[2], sys.argv[3]))
