"""Entry point: compose `conf/` with Hydra, validate, create the run folder, hand off to a cluster backend.

    python launch.py +experiment=search_r1                  # Slurm, one heterogeneous job
    python launch.py +experiment=search_r1_cpu              # local processes (the embedded default)
    python launch.py +experiment=search_r1_cpu mode=eval    # held-out evaluation of the model or a checkpoint
    python launch.py +experiment=search_r1_cpu mode=ask checkpoint=RUN question="..."   # ask the agent
    python launch.py +experiment=search_r1_cpu mode=pass_rate checkpoint=CKPT    # RL's pool: a checkpoint's pass rates
    python launch.py -m +experiment=search_r1 optim.lr=1e-6,2e-6   # one job per sweep point
    python launch.py +experiment=search_r1 --cfg job        # print the composed config

This is the only file that touches Hydra; the library takes the plain `Config` dataclass.
"""
from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from searchr1.checks import refuse_non_finite
from searchr1.config import Config, ConfigError, unknown_keys

ConfigStore.instance().store(name="base_config", node=Config)
CONF_DIR = str(Path(__file__).resolve().parent / "conf")


def compose_config(overrides: list[str]) -> Config:
    """The validated config a run with these overrides gets, for code that is not itself a Hydra app (the
    benchmarks, the tests)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return validate(compose("config", overrides=list(overrides)))


def validate(dcfg: DictConfig) -> Config:
    unknown = unknown_keys(dcfg)
    if unknown:
        raise SystemExit(f"config error: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}")
    try:
        refuse_non_finite(OmegaConf.to_container(dcfg, resolve=True))
        return OmegaConf.to_object(dcfg)
    except ConfigError as err:
        raise SystemExit(f"config error: {err}")
    except OmegaConfBaseException as err:  # to_object wraps __post_init__ errors
        cause = err.__cause__ if isinstance(err.__cause__, ConfigError) else err
        raise SystemExit(f"config error: {cause}")


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(dcfg: DictConfig) -> None:
    cfg = validate(dcfg)
    if cfg.mode == "ask":  # interactive, in this process: no run folder, no job
        from searchr1.apps.ask import main as ask

        sys.exit(ask(cfg))
    if _is_multirun() and not cfg.wandb.group:  # every point of one sweep in one wandb group
        from hydra.core.hydra_config import HydraConfig

        cfg.wandb.group = f"{cfg.experiment}/sweep-{Path(HydraConfig.get().sweep.dir).name}"
    from searchr1 import preflight

    try:
        preflight.check(cfg)  # paths and data limits, before a run folder or a rank exists
    except ConfigError as err:
        raise SystemExit(f"config error: {err}")
    from searchr1 import rundir
    from searchr1.cluster import job

    run_dir = rundir.create(cfg)
    print(f"run folder: {run_dir}", flush=True)
    if cfg.cluster.backend == "slurm":
        from searchr1.cluster.slurm import launch
    else:
        from searchr1.cluster.local import launch
    todo = (job.joining(cfg) if cfg.join else job.evaluation(cfg) if cfg.mode == "eval"
            else job.pass_rates(cfg) if cfg.mode == "pass_rate" else job.training(cfg))
    rc = launch(cfg, run_dir, todo)
    if rc != 0:
        # Under -m a failed sweep point must not stop the others; a single run exits with its code.
        if _is_multirun():
            print(f"run {run_dir} failed with exit code {rc}", file=sys.stderr)
            return
        sys.exit(rc)


def _is_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def show_config(argv: list[str]) -> None:
    """`--cfg job|hydra|all` with validation: Hydra's own --cfg prints without ever building the dataclasses,
    so a negative lr would print fine and only fail at launch."""
    from hydra import compose, initialize_config_dir

    i = next(i for i, a in enumerate(argv) if a in ("--cfg", "-c"))
    kind = argv[i + 1] if i + 1 < len(argv) else "job"
    overrides = [a for j, a in enumerate(argv) if j not in (i, i + 1) and not a.startswith("-")]
    from hydra.errors import HydraException

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        try:
            dcfg = compose("config", overrides=overrides, return_hydra_config=kind != "job")
        except HydraException as err:
            detail = f" ({err.__cause__})" if err.__cause__ else ""
            raise SystemExit(f"config error: {err}{detail}")
    job = {k: v for k, v in dcfg.items() if k != "hydra"} if kind != "job" else dcfg
    validate(OmegaConf.create(job))
    shown = {"hydra": dcfg.hydra} if kind == "hydra" else dcfg
    print(OmegaConf.to_yaml(shown, resolve="--resolve" in argv), end="")


def quote_free_text(argv: list[str]) -> list[str]:
    """`question=...` is free text: Hydra's override grammar refuses '?', ',', ':' or a dash unquoted, so the
    value goes to Hydra single-quoted (as typed, unless the user quoted it for Hydra already)."""
    out = []
    for a in argv:
        key, eq, value = a.partition("=")
        if key == "question" and eq and not value[:1] in ("'", '"'):
            a = "question='" + value.replace("'", "\\'") + "'"
        out.append(a)
    return out


if __name__ == "__main__":
    sys.argv = quote_free_text(sys.argv)
    if "--cfg" in sys.argv or "-c" in sys.argv:
        show_config(sys.argv[1:])
    else:
        main()
