"""The run folder: one per run, never reused.

Layout:
  config.yaml        the resolved config (what every rank reads back)
  git.json           commit, dirty flag, branch
  submit.sbatch      the generated Slurm script (Slurm backend)
  logs/rank{R}.log   one log per rank
  metrics.jsonl      one line per step (and per evaluation), written by rank 0
  predictions/       held-out predictions per evaluation
  checkpoints/       trainer checkpoints; `latest` names the newest complete one
  status.json        how the job ended (backend)
"""
from __future__ import annotations

import datetime
import json
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
    return path.resolve()


def load_config(run_dir: str | Path) -> Config:
    return from_dict(OmegaConf.to_container(OmegaConf.load(Path(run_dir) / "config.yaml")))


def write_status(run_dir: Path, **fields) -> None:
    """Merge fields into status.json (atomic replace: a reader never sees half a file)."""
    path = Path(run_dir) / "status.json"
    status = json.loads(path.read_text()) if path.exists() else {}
    status.update(fields)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(status, indent=1) + "\n")
    tmp.replace(path)
