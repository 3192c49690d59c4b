"""Checkpoints, with one owner: their layout, the `latest` pointer, rotation, resume, and what evaluation loads.

    run_dir/checkpoints/
      step_000010/        one complete checkpoint, written into a temporary folder and renamed into place
        model/            an HF directory (fp32 safetensors, config, tokenizer): evaluable as model.path
        trainer.pt        the learner's state (optimizer, scheduler, step, RNG) and `extra` (the step, the weights
                          version, a schedule's in-flight state)
        reference.pt      the KL reference's weights, when it is not the base model (RL after a warm start)
        critic.pt         the algorithm's own trainable state (PPO's value head), when it has one; never in model/,
                          which holds the policy only (what evaluation and the rollouts load)
        manifest.json     every other file's size and sha256, so a checkpoint proves itself
      latest              the name of the newest complete checkpoint; moved only once that one is complete
      damaged-step_000012/  a checkpoint whose files no longer match its manifest: kept aside, never deleted

A crash at any instant leaves `latest` naming a complete checkpoint (or none): the files are flushed to disk
before the folder is renamed into place, the pointer is replaced atomically after that, and older folders are
deleted only then. A checkpoint damaged later (a disk, a copy cut short) is found by its manifest when a run
resumes or evaluates it: it is named in the log and status.json, moved aside, and the newest intact one is used.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import torch

STATE_FILE = "trainer.pt"
MODEL_DIR = "model"
MANIFEST = "manifest.json"
REFERENCE_FILE = "reference.pt"
CRITIC_FILE = "critic.pt"
POINTER = "latest"
DAMAGED = "damaged-"  # prefix of a checkpoint folder moved aside (not matched by step_*, so never rotated away)

log = logging.getLogger(__name__)


class CheckpointDamaged(RuntimeError):
    """A checkpoint whose files are missing or differ from its manifest; the message names the file and why."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file() and p.name != MANIFEST)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _seal(path: Path) -> None:
    """Write the manifest of a checkpoint folder and flush every file and folder of it to disk."""
    files = {str(f.relative_to(path)): {"size": f.stat().st_size, "sha256": _sha256(f)} for f in _files(path)}
    (path / MANIFEST).write_text(json.dumps({"files": files}, indent=1) + "\n")
    for f in [*_files(path), path / MANIFEST]:
        _fsync(f)
    for d in sorted({f.parent for f in _files(path)} | {path}, key=lambda d: -len(d.parts)):
        _fsync(d)


def verify(path: Path) -> None:
    """Raise CheckpointDamaged naming the first file of checkpoint `path` that is missing or differs from its
    manifest. A checkpoint written before manifests existed is only checked for its two parts."""
    path = Path(path)
    manifest = path / MANIFEST
    if not manifest.is_file():
        if not (path / STATE_FILE).is_file() or not (path / MODEL_DIR).is_dir():
            raise CheckpointDamaged(f"{path}: incomplete (no {MANIFEST}, {STATE_FILE} or {MODEL_DIR}/)")
        log.warning("checkpoint %s has no %s (written by an older version): not verified", path, MANIFEST)
        return
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointDamaged(f"{manifest}: unreadable ({type(e).__name__}: {e})") from e
    for name, meta in files.items():
        f = path / name
        if not f.is_file():
            raise CheckpointDamaged(f"{f}: missing (listed in {MANIFEST})")
        if f.stat().st_size != meta["size"]:
            raise CheckpointDamaged(f"{f}: {f.stat().st_size} bytes, the manifest says {meta['size']} (cut short)")
        if _sha256(f) != meta["sha256"]:
            raise CheckpointDamaged(f"{f}: content differs from the manifest's sha256 (damaged)")


def _name(step: int) -> str:
    return f"step_{step:06d}"


def save(run_dir: Path, step: int, learner, extra: dict, keep: int) -> Path:
    """Every trainer rank calls this; rank 0 writes, the replicas wait until the checkpoint is complete."""
    root = Path(run_dir) / "checkpoints"
    path = root / _name(step)
    if learner.rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            learner.module.save_pretrained(tmp / MODEL_DIR)
            learner.tokenizer.save_pretrained(tmp / MODEL_DIR)
            torch.save({**learner.state_dict(), "extra": dict(extra)}, tmp / STATE_FILE)
            if getattr(learner, "ref", None) is not None and learner.ref_step > 0:  # a reference no model file holds
                torch.save({"step": learner.ref_step, "weights": learner.ref.policy.state_dict()},
                           tmp / REFERENCE_FILE)
            if learner.critic is not None:
                torch.save(learner.critic.state_dict(), tmp / CRITIC_FILE)
            _seal(tmp)
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            if path.exists():
                os.rename(path, old)
            os.rename(tmp, path)
            _fsync(root)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        pointer = root / f"{POINTER}.tmp"
        pointer.write_text(path.name + "\n")
        _fsync(pointer)
        pointer.replace(root / POINTER)
        _fsync(root)
        for stale in sorted(p for p in root.glob("step_*") if p.is_dir())[:-keep]:
            shutil.rmtree(stale, ignore_errors=True)
    learner.barrier()
    return path


def latest(run_dir: Path) -> Path | None:
    """The newest intact checkpoint of a run folder, or None: the one `latest` names, else (when that one is
    damaged) the newest step_* folder whose files match its manifest. Each damaged one met on the way is moved
    aside as damaged-step_*, and named in the log and in the run's status.json."""
    root = Path(run_dir) / "checkpoints"
    pointer = root / POINTER
    if not pointer.is_file():
        return None
    named = root / pointer.read_text().strip()
    others = sorted((p for p in root.glob("step_*") if p.is_dir() and p != named), reverse=True)
    for path in ([named] if named.is_dir() else []) + others:
        try:
            verify(path)
            return path
        except CheckpointDamaged as e:
            _set_aside(Path(run_dir), path, str(e))
    if not named.is_dir():
        log.warning("%s names %s, which does not exist, and no other checkpoint is intact", pointer, named.name)
    return None


def _set_aside(run_dir: Path, path: Path, why: str) -> None:
    """Move a damaged checkpoint out of the way (kept for a person to look at); replicas that find it too race
    for the rename, and only the one that wins records it."""
    aside = path.with_name(DAMAGED + path.name)
    try:
        os.rename(path, aside)
    except OSError:
        return  # another rank moved it first (or it vanished): that rank records it
    log.error("checkpoint %s is damaged, moved to %s and skipped: %s", path.name, aside.name, why)
    from searchr1.rundir import write_status

    status = run_dir / "status.json"
    skipped = json.loads(status.read_text()).get("checkpoints_skipped", []) if status.is_file() else []
    write_status(run_dir, checkpoints_skipped=[*skipped, {"checkpoint": path.name, "moved_to": aside.name,
                                                          "why": why}])


def newest_before(run_dir: Path, step: int) -> Path | None:
    """The newest checkpoint of a run folder saved before `step` (the last good one before a collapse), or None."""
    found = [p for p in (Path(run_dir) / "checkpoints").glob("step_*") if p.is_dir() and int(p.name[5:]) < step]
    return max(found, key=lambda p: int(p.name[5:]), default=None)


def resume_point(run_dir: Path, resume: str) -> Path | None:
    """Where a run continues from: its own newest checkpoint (a requeued job), else that of `resume`."""
    return latest(run_dir) or (latest(Path(resume)) if resume else None)


def load(path: Path, learner) -> dict:
    """Restore everything `save` wrote into `learner` (on every replica); returns the checkpoint's `extra`."""
    path = Path(path)
    state_file, model_dir = path / STATE_FILE, path / MODEL_DIR
    if not state_file.is_file() or not model_dir.is_dir():
        raise FileNotFoundError(f"{path}: not a trainer checkpoint (needs {STATE_FILE} and {MODEL_DIR}/)")
    critic_file = path / CRITIC_FILE
    if learner.critic is not None and not critic_file.is_file():
        raise FileNotFoundError(f"{path}: no {CRITIC_FILE}, which algo.name={learner.algo.cfg.name!r} needs (a "
                                "checkpoint of an objective without a critic cannot continue as one with a critic)")
    # weights_only=False: the file holds numpy and python RNG states, and it is one this module wrote.
    sd = _torch_load(state_file, learner.device)
    learner.load_state_dict(sd, _read_safetensors(model_dir, learner.module, learner.device))
    ref_file = path / REFERENCE_FILE
    if getattr(learner, "ref", None) is not None and ref_file.is_file():  # the reference the uninterrupted run had
        ref = _torch_load(ref_file, learner.device)
        learner.ref.policy.load_state_dict(ref["weights"])
        learner.ref_step = int(ref["step"])
    if learner.critic is not None:  # every replica loads the same file: the critics stay equal, as the policies do
        learner.critic.load_state_dict(_torch_load(critic_file, learner.device))
    return sd.get("extra", {})


def read_extra(path: Path) -> dict:
    """A checkpoint's `extra` without loading a model (the rollout side of a resumed run needs only this)."""
    return _torch_load(Path(path) / STATE_FILE, "cpu").get("extra", {})


def _torch_load(path: Path, device) -> dict:
    try:
        return torch.load(path, map_location=device, weights_only=False)
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointDamaged(f"{path}: unreadable ({type(e).__name__}: {str(e).splitlines()[0]})") from e


def model_path(path: str | Path) -> Path:
    """The HF directory to evaluate for `path`: a checkpoint folder (its model/) or an HF directory itself."""
    path = Path(path).expanduser()
    if (path / MANIFEST).is_file() or (path / STATE_FILE).is_file():
        verify(path)  # a trainer checkpoint proves itself before anything evaluates it
    for candidate in (path / MODEL_DIR, path):
        if (candidate / "config.json").is_file():
            check_weights(candidate)
            return candidate
    raise FileNotFoundError(f"checkpoint={str(path)!r}: neither a trainer checkpoint ({MODEL_DIR}/config.json) "
                            "nor an HF model directory (config.json)")


def check_weights(model_dir: Path) -> None:
    """Every *.safetensors file of an HF directory has a readable header (a file cut short does not), named if not."""
    from safetensors import safe_open

    for f in sorted(Path(model_dir).glob("*.safetensors")):
        try:
            with safe_open(str(f), framework="pt") as st:
                st.keys()
        except Exception as e:  # noqa: BLE001 (safetensors raises its own SafetensorError, and OSError)
            raise CheckpointDamaged(f"{f}: not a readable safetensors file ({e})") from e


def _read_safetensors(model_dir: Path, module: torch.nn.Module, device) -> dict[str, torch.Tensor]:
    """The state dict of an HF directory, with tied names filled in from the tensor they alias."""
    from safetensors.torch import load_file

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors weights")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            sd.update(load_file(f, device=str(device)))
        except Exception as e:  # noqa: BLE001 (SafetensorError names no file)
            raise CheckpointDamaged(f"{f}: not a readable safetensors file ({e})") from e
    own = module.state_dict()
    by_storage = {(t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape)): n
                  for n, t in reversed(list(own.items()))}
    for name, t in own.items():
        if name not in sd:
            alias = by_storage[(t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))]
            if alias not in sd:
                raise KeyError(f"{model_dir}: weight {name!r} is missing")
            sd[name] = sd[alias]
    unexpected = sorted(set(sd) - set(own))
    if unexpected:
        raise KeyError(f"{model_dir}: weights {unexpected[:5]} do not belong to this model")
    return sd
