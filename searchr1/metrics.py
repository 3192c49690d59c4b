"""One writer for `metrics.jsonl` and wandb, with the same keys in both.

Only rank 0 writes. Each line is flushed and fsynced as it is written, so a crash later in the run loses
nothing already logged. wandb runs offline by default; the WANDB_MODE environment variable wins over the config.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from pathlib import Path

from searchr1.config import Config


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf; a reader sees a missing value, not a parse error
    return value


class MetricsWriter:
    def __init__(self, cfg: Config, run_dir: Path, resume: bool = False):
        self.path = Path(run_dir) / "metrics.jsonl"
        self._file = open(self.path, "a", encoding="utf-8")
        self._wandb = None
        mode = os.environ.get("WANDB_MODE", cfg.wandb.mode)
        if mode != "disabled":
            import wandb

            self._wandb = wandb.init(
                project=cfg.wandb.project, entity=cfg.wandb.entity or None, mode=mode, dir=str(run_dir),
                name=Path(run_dir).name, id=Path(run_dir).name.replace(":", "-"), resume="allow" if resume else None,
                config=json.loads(json.dumps(asdict(cfg))))

    def log(self, record: dict) -> None:
        record = {k: _clean(v) for k, v in record.items()}
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        if self._wandb is not None:
            step = record.get("step")
            self._wandb.log({k: v for k, v in record.items() if isinstance(v, (int, float)) and v is not None},
                            step=step)

    def close(self) -> None:
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def read_metrics(path: str | Path) -> list[dict]:
    """Every record of a metrics.jsonl; a torn last line (a crash mid-write) is reported, not hidden."""
    out = []
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: line {i + 1} is not valid JSON ({err.msg})") from err
    return out
