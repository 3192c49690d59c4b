"""Every experiment composes and validates; bad values fail before anything starts, naming the key."""
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import launch  # noqa: E402  (registers the schema)
from searchr1.config import Config, ConfigError, from_dict  # noqa: E402

EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))


def compose_cfg(*overrides) -> Config:
    return launch.compose_config(overrides)


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
    ("optim.lr=-1", "optim.lr=-1.0"),
    ("algo.group_size=1", "algo.group_size=1"),
    ("cluster.trainer_ranks=20", "cluster.trainer_ranks=20"),
    ("sync.method=sometimes", "sync.method='sometimes'"),
    ("sync.codec=zstd", "sync.codec='zstd'"),
    ("retriever.top_k=0", "retriever.top_k=0"),
    ("schedule.partial_tokens=512", "schedule.partial_tokens=512"),  # sync: partial rollouts need streaming
])
def test_out_of_range_values_name_the_key(override, needle):
    with pytest.raises(SystemExit) as err:
        compose_cfg("+experiment=search_r1", override)
    assert needle in str(err.value)


def test_unknown_key_and_wrong_type_fail_at_composition():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="algo.bogus"):
        compose_cfg("algo.bogus=3")
    with pytest.raises(ConfigCompositionException, match="optim.lr"):
        compose_cfg("optim.lr=abc")


@pytest.mark.parametrize("override", ["optim.lr=-1", "algo.group_size=1", "algo.nope=1", "+algo.lrr=3",
                                      "+no_such_key=3"])
def test_launch_cli_exits_nonzero_naming_the_key(override):
    key = override.split("=")[0].lstrip("+")
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
    r = subprocess.run([sys.executable, "launch.py", "-m", "+experiment=search_r1", "optim.lr=1e-6,2e-6",
                        "cluster.slurm.submit=false", f"run_root={tmp_path}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = sorted(p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert len(runs) == 2
    lrs = sorted(OmegaConf.load(p / "config.yaml").optim.lr for p in runs)
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


def test_an_added_key_is_refused_with_the_nearest_valid_one():
    with pytest.raises(SystemExit, match=r"algo.lrr \(did you mean optim.lr\?\)"):
        compose_cfg("+experiment=search_r1_cpu", "+algo.lrr=3")
    with pytest.raises(SystemExit, match=r"cluster.heartbeat_timout_s \(did you mean cluster.heartbeat_timeout_s"):
        compose_cfg("+cluster.heartbeat_timout_s=3")
    with pytest.raises(SystemExit, match="unknown key no_such_key"):
        compose_cfg("+no_such_key=3")
    r = subprocess.run([sys.executable, "launch.py", "+experiment=search_r1_cpu", "+algo.lrr=3", "--cfg", "job"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "did you mean optim.lr" in r.stderr


def test_training_refuses_a_sampling_distribution_the_behaviour_log_probs_do_not_describe():
    with pytest.raises(SystemExit, match="training samples with top_p 1"):
        compose_cfg("+experiment=smoke", "sampling.top_p=0.9")
    with pytest.raises(SystemExit, match="sampling.temperature=0.0: training samples"):
        compose_cfg("+experiment=smoke", "sampling.temperature=0")
    # another temperature is part of the contract (engines and trainer both use it); evaluation is free
    assert compose_cfg("+experiment=smoke", "sampling.temperature=0.7").sampling.temperature == 0.7
    assert compose_cfg("+experiment=smoke", "mode=eval", "sampling.top_p=0.9").sampling.top_p == 0.9


def test_choices_come_from_the_registries():
    from searchr1 import registry

    for group, table in (("engine", registry.ENGINES), ("retriever", registry.RETRIEVERS),
                         ("algo", registry.ALGORITHMS), ("schedule", registry.SCHEDULES),
                         ("reward", registry.REWARDS)):
        for option in (ROOT / "conf" / group).glob("*.yaml"):
            name = OmegaConf.load(option).get("name")
            assert name in table, (group, option.name)
        with pytest.raises(SystemExit, match=f"{group}.name='nope'"):
            compose_cfg(f"{group}.name=nope")


# a group's option may name itself (its selector) even where that equals the default
SELECTORS = {"name", "source", "method", "backend", "prompt"}


def _leaves(node, prefix=""):
    for k, v in node.items():
        if isinstance(v, dict):
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _default(path):
    node = Config()
    for part in path.split("."):
        node = getattr(node, part)
    return node


def test_each_default_is_stated_once():
    """No option file of a group and no experiment restates a schema default: an edit to a default in
    searchr1/config.py reaches every experiment that does not override it on purpose."""
    restated = []
    for path in sorted((ROOT / "conf").rglob("*.yaml")):
        group = path.parent.name
        if path.name == "config.yaml":
            continue
        data = OmegaConf.to_container(OmegaConf.load(path))
        # an experiment built on another (`defaults: [search_r1_cpu, ...]`) may restore a default its parent changed
        parents = {}
        for entry in data.pop("defaults", None) or []:
            if group == "experiment" and isinstance(entry, str) and (path.parent / f"{entry}.yaml").is_file():
                parents.update(_leaves(OmegaConf.to_container(OmegaConf.load(path.parent / f"{entry}.yaml"))))
        prefix = "" if group == "experiment" else f"{group}."
        for key, value in _leaves(data, prefix):
            if key.rsplit(".", 1)[-1] in SELECTORS and group != "experiment":
                continue
            if key in ("experiment",):
                continue
            if value == _default(key) and parents.get(key, value) == value:
                restated.append(f"{path.relative_to(ROOT)}: {key}={value!r}")
    assert not restated, restated


def test_compute_dtypes_take_their_short_spellings():
    cfg = compose_cfg("+experiment=search_r1_cpu", "trainer.compute_dtype=fp32", "engine.compute_dtype=bf16")
    assert (cfg.trainer.compute_dtype, cfg.engine.compute_dtype) == ("float32", "bfloat16")
    with pytest.raises(SystemExit, match="trainer.compute_dtype"):
        compose_cfg("trainer.compute_dtype=fp16")


def test_partial_rollouts_compose_with_streaming_only_and_without_dynamic_sampling():
    cfg = compose_cfg("+experiment=search_r1_cpu", "schedule=streaming", "schedule.partial_tokens=512")
    assert (cfg.schedule.name, cfg.schedule.partial_tokens) == ("streaming", 512)
    for bad in (["schedule=pipelined", "schedule.partial_tokens=512"],
                ["schedule=streaming", "schedule.partial_tokens=512", "algo.oversample=3"]):
        with pytest.raises(SystemExit, match="schedule.partial_tokens=512"):
            compose_cfg("+experiment=search_r1_cpu", *bad)
