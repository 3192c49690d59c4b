"""Bad input refused before anything starts, naming the key or the file; damaged checkpoints named, set aside and
skipped for the newest intact one (issue 26's table, row by row)."""
import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from searchr1 import checkpoint
from searchr1.config import Config
from test_learner import learner, make_trajs

ROOT = Path(__file__).resolve().parent.parent


def launch(run_root: Path, *overrides, timeout=900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "launch.py", "+experiment=smoke", f"run_root={run_root}", *overrides],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


ROWS = [
    ("resume=/nonexistent/run", "config error: resume='/nonexistent/run': no such run folder"),
    ("run_name=../../../tmp/escape", "config error: run_name='../../../tmp/escape': must be a single folder name"),
    ("run_name=..", "config error: run_name='..': must be a single folder name"),
    ("optim.lr=inf", "config error: optim.lr=inf: must be a finite number"),
    ("algo.questions_per_step=100000", "config error: algo.questions_per_step=100000: more than the training pool "
                                       "(500 questions) holds"),
    ("warm_start.steps=1 warm_start.questions_per_step=501", "warm_start.questions_per_step=501: more than the"),
    ("mode=eval checkpoint=/no/such/checkpoint", "config error: checkpoint='/no/such/checkpoint': no such file"),
    ("join=/no/such/run cluster.elastic.enabled=true", "config error: join='/no/such/run': no such run folder"),
    ("retriever=dense retriever.dense.encoder=/no/encoder", "retriever.dense.encoder='/no/encoder': not a directory"),
]


def refusal(overrides: list[str]) -> str:
    """What launch.py's main does before it creates anything (the schema, then preflight), in this process."""
    from launch import compose_config
    from searchr1 import preflight
    from searchr1.checks import ConfigError

    try:
        preflight.check(compose_config(["+experiment=smoke", *overrides]))
    except SystemExit as e:
        return str(e)
    except ConfigError as e:
        return f"config error: {e}"
    return ""


@pytest.mark.parametrize("override, message", ROWS)
def test_bad_input_is_one_line_naming_it(override, message):
    assert message in refusal(override.split())


@pytest.mark.parametrize("override, message", [ROWS[0], ROWS[4]])
def test_the_launcher_refuses_before_any_folder_or_rank(tmp_path, override, message):
    r = launch(tmp_path / "runs", *override.split())
    assert r.returncode != 0
    last = (r.stderr or r.stdout).strip().splitlines()[-1]
    assert message in last, r.stdout[-2000:] + r.stderr[-2000:]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # nothing was created


def _float_keys(obj, prefix=""):
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            yield from _float_keys(v, f"{prefix}{f.name}.")
        elif isinstance(v, float):
            yield f"{prefix}{f.name}"


def test_every_float_key_refuses_infinity_and_nan():
    from launch import compose_config

    keys = list(_float_keys(Config()))
    assert len(keys) > 20 and "optim.lr" in keys and "sampling.temperature" in keys
    for key, bad in [(k, "inf") for k in keys] + [("optim.lr", "-inf"), ("optim.lr", "nan")]:
        with pytest.raises(SystemExit, match=rf"config error: {key}=.*(finite|must be)"):
            compose_config(["+experiment=smoke", f"{key}={bad}"])


# ------------------------------------------------------------------ damaged checkpoints

@pytest.fixture(scope="module")
def three_checkpoints(tmp_path_factory):
    run = tmp_path_factory.mktemp("template")
    tr = learner(lr=1e-2)
    for step in (1, 2, 3):
        tr.step(make_trajs(30 + step))
        checkpoint.save(run, step, tr, {"step": step}, keep=3)
    return run


def damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "cut":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:
        data[len(data) // 3] ^= 0xFF
        path.write_bytes(bytes(data))


KINDS = ["trainer.pt", "model/model.safetensors", "model/config.json", "model/tokenizer.json", "manifest.json"]


@pytest.mark.parametrize("how", ["cut", "flip"])
@pytest.mark.parametrize("name", KINDS)
def test_a_damaged_checkpoint_is_named_set_aside_and_the_newest_intact_one_resumes(three_checkpoints, tmp_path,
                                                                                    name, how):
    run = tmp_path / "run"
    shutil.copytree(three_checkpoints, run)
    newest = run / "checkpoints" / "step_000003"
    damage(newest / name, how)
    with pytest.raises(checkpoint.CheckpointDamaged, match=Path(name).name if name != "manifest.json" else "manifest"):
        checkpoint.verify(newest)
    point = checkpoint.latest(run)
    assert point.name == "step_000002"
    assert checkpoint.load(point, learner()) == {"step": 2}  # the run resumes from it
    aside = run / "checkpoints" / "damaged-step_000003"
    assert aside.is_dir() and not newest.exists()  # kept for a person to look at, not deleted
    (skipped,) = json.loads((run / "status.json").read_text())["checkpoints_skipped"]
    assert skipped["checkpoint"] == "step_000003" and skipped["moved_to"] == aside.name
    assert checkpoint.latest(run).name == "step_000002"  # and found at once the next time


def test_evaluating_a_damaged_checkpoint_names_the_file(three_checkpoints, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(three_checkpoints, run)
    ckpt = run / "checkpoints" / "step_000003"
    weights = ckpt / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])
    r = launch(tmp_path / "runs", "mode=eval", f"checkpoint={ckpt}")
    assert r.returncode != 0
    assert f"{weights}: " in r.stderr.strip().splitlines()[-1] and "cut short" in r.stderr
    bare = tmp_path / "hf"  # an HF directory without a manifest: its header is read, and the file named
    shutil.copytree(ckpt / "model", bare)
    r = launch(tmp_path / "runs", "mode=eval", f"checkpoint={bare}")
    assert r.returncode != 0 and f"{bare / 'model.safetensors'}: not a readable safetensors file" in r.stderr


@pytest.mark.slow
def test_resume_skips_a_cut_trainer_state_and_continues_from_the_intact_checkpoint(tmp_path):
    r = launch(tmp_path, "steps=3", "checkpoint_every=1", "keep_checkpoints=3", "run_name=first")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    state = tmp_path / "first" / "checkpoints" / "step_000003" / "trainer.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    r = launch(tmp_path, "steps=4", f"resume={tmp_path / 'first'}", "run_name=second")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    logs = "".join(p.read_text() for p in (tmp_path / "second" / "logs").glob("rank*.log"))
    assert "resumed from" in logs and "step_000002 at step 2" in logs
    assert (tmp_path / "first" / "checkpoints" / "damaged-step_000003" / "trainer.pt").is_file()
    skipped = json.loads((tmp_path / "first" / "status.json").read_text())["checkpoints_skipped"]
    assert skipped[0]["checkpoint"] == "step_000003" and "trainer.pt" in skipped[0]["why"]
