"""Every experiment composes and validates; bad values fail before anything starts, naming the key."""
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import launch  # noqa: E402  (registers the schema)
from searchr1.config import Config, ConfigError, from_dict  # noqa: E402

EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))


def compose_cfg(*overrides) -> Config:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return launch.validate(compose("config", overrides=list(overrides)))


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes(name):
    cfg = compose_cfg(f"+experiment={name}")
    assert isinstance(cfg, Config) and cfg.experiment == name


def test_production_and_cpu_experiments():
    prod = compose_cfg("+experiment=search_r1")
    assert (prod.model.path, prod.cluster.backend) == ("Qwen/Qwen2.5-3B-Instruct", "slurm")
    assert (prod.cluster.trainer_ranks, prod.cluster.rollout_ranks, prod.steps) == (2, 14, 100)
    assert (prod.algo.name, prod.sync.method, prod.data.eval_size) == ("grpo", "delta", 200)
    cpu = compose_cfg("+experiment=search_r1_cpu")
    assert (cpu.model.source, cpu.cluster.backend) == ("smollm2_gguf", "local")
    assert (cpu.cluster.trainer_ranks, cpu.cluster.rollout_ranks) == (2, 2)


@pytest.mark.parametrize("override,needle", [
    ("algo.lr=-1", "algo.lr=-1.0"),
    ("algo.group_size=1", "algo.group_size=1"),
    ("cluster.trainer_ranks=20", "cluster.trainer_ranks=20"),
    ("sync.method=sometimes", "sync.method='sometimes'"),
    ("sync.codec=zstd", "sync.codec='zstd'"),
    ("retriever.top_k=0", "retriever.top_k=0"),
])
def test_out_of_range_values_name_the_key(override, needle):
    with pytest.raises(SystemExit) as err:
        compose_cfg("+experiment=search_r1", override)
    assert needle in str(err.value)


def test_unknown_key_and_wrong_type_fail_at_composition():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="algo.bogus"):
        compose_cfg("algo.bogus=3")
    with pytest.raises(ConfigCompositionException, match="algo.lr"):
        compose_cfg("algo.lr=abc")


@pytest.mark.parametrize("override", ["algo.lr=-1", "algo.group_size=1", "algo.nope=1"])
def test_launch_cli_exits_nonzero_naming_the_key(override):
    key = override.split("=")[0]
    for extra in (["--cfg", "job"], ["run_root=/nonexistent/should-not-be-created"]):
        r = subprocess.run([sys.executable, "launch.py", "+experiment=search_r1", override, *extra],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and key in (r.stdout + r.stderr)
    assert not Path("/nonexistent/should-not-be-created").exists()


def test_cfg_job_prints_the_composed_config():
    r = subprocess.run([sys.executable, "launch.py", "+experiment=search_r1", "--cfg", "job"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    printed = OmegaConf.create(r.stdout)
    assert printed.model.path == "Qwen/Qwen2.5-3B-Instruct" and printed.cluster.rollout_ranks == 14


def test_multirun_sweep_makes_one_run_per_point(tmp_path):
    """`-m` through the real launcher: each sweep point gets its own run folder and submission script
    (cluster.slurm.submit=false writes the script without submitting, so no cluster is needed)."""
    r = subprocess.run([sys.executable, "launch.py", "-m", "+experiment=search_r1", "algo.lr=1e-6,2e-6",
                        "cluster.slurm.submit=false", f"run_root={tmp_path}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = sorted(p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert len(runs) == 2
    lrs = sorted(OmegaConf.load(p / "config.yaml").algo.lr for p in runs)
    assert lrs == [1e-6, 2e-6]
    for p in runs:
        assert "#SBATCH hetjob" in (p / "submit.sbatch").read_text()


def test_run_folder_config_round_trips():
    cfg = compose_cfg("+experiment=search_r1_cpu")
    again = from_dict(OmegaConf.to_container(OmegaConf.structured(cfg)))
    assert again == cfg
    with pytest.raises(Exception):
        from_dict({**OmegaConf.to_container(OmegaConf.structured(cfg)), "steps": -3})


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)
