"""What launch.py checks before it creates a run folder or starts a rank: every key that names a path points at what
it should (a run folder with a checkpoint, a checkpoint, a model directory, an encoder), the data loads, and the
limits that depend on the data hold (questions per step against the training pool). Each failure is one line
naming the key, the file or the value; nothing has been written when it is raised.

The schemas (searchr1/config.py) check each value alone; this module checks values against the file system and
the data, which a schema cannot see.
"""
from __future__ import annotations

from pathlib import Path

from searchr1 import checkpoint
from searchr1.checks import ConfigError
from searchr1.config import Config


def _run_folder_with_checkpoint(key: str, value: str) -> None:
    path = Path(value).expanduser()
    if not path.is_dir():
        raise ConfigError(f"{key}={value!r}: no such run folder")
    if not (path / "config.yaml").is_file():
        raise ConfigError(f"{key}={value!r}: not a run folder (no config.yaml)")
    if key == "resume" and checkpoint.latest(path) is None:
        raise ConfigError(f"{key}={value!r}: the run folder holds no intact checkpoint (checkpoints/latest)")


def _paths(cfg: Config) -> None:
    if cfg.resume:
        _run_folder_with_checkpoint("resume", cfg.resume)
    if cfg.join:
        _run_folder_with_checkpoint("join", cfg.join)
    if cfg.checkpoint:
        if not Path(cfg.checkpoint).expanduser().exists():
            raise ConfigError(f"checkpoint={cfg.checkpoint!r}: no such file or folder")
        try:
            checkpoint.model_path(cfg.checkpoint)
        except (FileNotFoundError, checkpoint.CheckpointDamaged) as e:
            raise ConfigError(f"checkpoint={cfg.checkpoint!r}: {e}") from e
    c = cfg.curriculum
    if c.rl == "pass_rate" and not Path(c.pass_rates).expanduser().is_file():
        raise ConfigError(f"curriculum.pass_rates={c.pass_rates!r}: no such file (mode=pass_rate writes one)")
    root = Path(cfg.run_root).expanduser()
    if root.exists() and not root.is_dir():
        raise ConfigError(f"run_root={cfg.run_root!r}: exists and is not a folder")
    m = cfg.model
    if m.source == "hub" and m.path.startswith((".", "/", "~")) and not Path(m.path).expanduser().is_dir():
        raise ConfigError(f"model.path={m.path!r}: no such model directory")
    if cfg.agent.search and cfg.retriever.name in ("dense", "hybrid"):
        from searchr1.retrieval.dense import encoder_dir, weight_files

        try:
            weight_files(encoder_dir(cfg.retriever.dense.encoder))
        except FileNotFoundError as e:
            raise ConfigError(str(e)) from e


def _data_limits(cfg: Config) -> None:
    from searchr1.data import DataError
    from searchr1.datasets import load_all
    from searchr1.rundir import REPO_ROOT

    try:
        splits = load_all(cfg.data, REPO_ROOT)  # every evaluation set too: malformed or overlapping, it fails here
    except DataError as e:
        raise ConfigError(str(e)) from e
    pool = len(splits.train)
    c = cfg.curriculum
    if c.rl == "pass_rate":  # a damaged file, or one measured on other questions, stops here
        from searchr1 import curriculum

        try:
            kept = len(curriculum.pass_rate_pool(c, splits.train))
        except ValueError as e:
            raise ConfigError(str(e)) from e
        if kept < cfg.algo.questions_per_step:
            measured = len(Path(c.pass_rates).expanduser().read_text().splitlines())
            raise ConfigError(f"curriculum.pass_rates={c.pass_rates!r}: {kept} of its {measured} questions have a "
                              f"pass rate in ({c.pass_rate_min}, {c.pass_rate_max}), fewer than "
                              f"algo.questions_per_step={cfg.algo.questions_per_step}")
    if cfg.mode != "train":
        return
    if cfg.steps > 0 and cfg.algo.questions_per_step > pool:
        raise ConfigError(f"algo.questions_per_step={cfg.algo.questions_per_step}: more than the training pool "
                          f"({pool} questions) holds")
    if cfg.warm_start.steps > 0 and cfg.warm_start.questions_per_step > pool:
        raise ConfigError(f"warm_start.questions_per_step={cfg.warm_start.questions_per_step}: more than the "
                          f"training pool ({pool} questions) holds")


def check(cfg: Config) -> None:
    """Every check above; raises ConfigError (one line) at the first failure."""
    _paths(cfg)
    _data_limits(cfg)
