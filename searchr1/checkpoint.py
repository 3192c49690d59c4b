"""Checkpoints, with one owner: their layout, the `latest` pointer, rotation, resume, and what evaluation loads.

    run_dir/checkpoints/
      step_000010/        one complete checkpoint, written into a temporary folder and renamed into place
        model/            an HF directory (fp32 safetensors, config, tokenizer): evaluable as model.path
        trainer.pt        the learner's state (optimizer, scheduler, step, RNG) and `extra` (the step, the weights
                          version, a schedule's in-flight state)
      latest              the name of the newest complete checkpoint; moved only once that one is complete

A crash at any instant leaves `latest` naming a complete checkpoint (or none): the pointer is replaced
atomically after the folder is, and older folders are deleted only after that.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

STATE_FILE = "trainer.pt"
MODEL_DIR = "model"
POINTER = "latest"


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
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            if path.exists():
                os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        pointer = root / f"{POINTER}.tmp"
        pointer.write_text(path.name + "\n")
        pointer.replace(root / POINTER)
        for stale in sorted(p for p in root.glob("step_*") if p.is_dir())[:-keep]:
            shutil.rmtree(stale, ignore_errors=True)
    learner.barrier()
    return path


def latest(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run folder, or None."""
    pointer = Path(run_dir) / "checkpoints" / POINTER
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text().strip()
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"{pointer} names {path.name}, which is not a complete checkpoint")
    return path


def resume_point(run_dir: Path, resume: str) -> Path | None:
    """Where a run continues from: its own newest checkpoint (a requeued job), else that of `resume`."""
    return latest(run_dir) or (latest(Path(resume)) if resume else None)


def load(path: Path, learner) -> dict:
    """Restore everything `save` wrote into `learner` (on every replica); returns the checkpoint's `extra`."""
    path = Path(path)
    state_file, model_dir = path / STATE_FILE, path / MODEL_DIR
    if not state_file.is_file() or not model_dir.is_dir():
        raise FileNotFoundError(f"{path}: not a trainer checkpoint (needs {STATE_FILE} and {MODEL_DIR}/)")
    # weights_only=False: the file holds numpy and python RNG states, and it is one this module wrote.
    sd = torch.load(state_file, map_location=learner.device, weights_only=False)
    learner.load_state_dict(sd, _read_safetensors(model_dir, learner.module, learner.device))
    return sd.get("extra", {})


def read_extra(path: Path) -> dict:
    """A checkpoint's `extra` without loading a model (the rollout side of a resumed run needs only this)."""
    return torch.load(Path(path) / STATE_FILE, map_location="cpu", weights_only=False).get("extra", {})


def model_path(path: str | Path) -> Path:
    """The HF directory to evaluate for `path`: a checkpoint folder (its model/) or an HF directory itself."""
    path = Path(path).expanduser()
    for candidate in (path / MODEL_DIR, path):
        if (candidate / "config.json").is_file():
            return candidate
    raise FileNotFoundError(f"checkpoint={str(path)!r}: neither a trainer checkpoint ({MODEL_DIR}/config.json) "
                            "nor an HF model directory (config.json)")


def _read_safetensors(model_dir: Path, module: torch.nn.Module, device) -> dict[str, torch.Tensor]:
    """The state dict of an HF directory, with tied names filled in from the tensor they alias."""
    from safetensors.torch import load_file

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors weights")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(f, device=str(device)))
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
