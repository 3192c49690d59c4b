"""Metrics, with one owner: the key names, how each kind of value is combined, the records, the writer.

Producers return namespaced values (`rollout/`, `train/`, `sync/`, `time/`); this module builds each step's
record from them by declared rules, and the run report, the notebook and the tests read the keys named below
instead of spelling strings. Naming: a `_total` key is a sum over the step's trajectories, a `_s` key seconds,
a `_count` key a count; every other `rollout/` and `eval/` key is a mean per trajectory or per question.

Rules:
- trajectory statistics (`rollout/*` except seconds) are computed over the whole batch's trajectories at once
  (searchr1.agent.trajectory_metrics), never averaged from per-unit means;
- a unit's seconds (`rollout/*_s`) are summed over the step's units: rank-seconds spent on the step's data;
- phase times `time/<role>/<phase>_s` are means over the role's ranks; `useful_work_fraction` is the useful
  rank-seconds (USEFUL phases) over all ranks' wall seconds;
- `train/` and `sync/` values arrive already reduced (the learner all-reduces, the publisher takes the
  slowest receiver) and are copied as they are.

`metrics.jsonl` gets one line per step and one per evaluation, flushed and fsynced as written; wandb gets the
same keys (offline by default; the WANDB_MODE environment variable wins). A resumed run first drops the lines
after its checkpoint, atomically, so each step appears exactly once.
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from searchr1.agent import trajectory_metrics
from searchr1.config import Config

log = logging.getLogger(__name__)

KIND, STEP, TRAIN, EVAL = "kind", "step", "train", "eval"
# One line per other held-out set (data.eval_sets) and evaluation: the eval/ keys of `eval_record` plus the set's
# name; their own kind, so that every reader of the HotpotQA evaluations (kind eval) reads what it did before.
EVAL_SET, DATASET = "eval_set", "dataset"
REWARD, EM, F1 = "rollout/reward", "rollout/em", "rollout/f1"
ANSWER_RATE, SEARCHES, SEARCHED_RATE = "rollout/answer_rate", "rollout/searches", "rollout/searched_rate"
TRAJECTORIES = "rollout/trajectories_total"
LAG_MAX, LAG_MEAN, VERSION_OLDEST = "lag/max", "lag/mean", "version/oldest"
EVAL_N, EVAL_EM_COUNT, EVAL_EM, EVAL_F1 = "eval/n", "eval/em_count", "eval/em", "eval/f1"
EVAL_ANSWER_RATE, EVAL_SEARCHES, EVAL_SEARCHED_RATE = "eval/answer_rate", "eval/searches", "eval/searched_rate"
LOSS, GRAD_NORM = "train/loss", "train/grad_norm"
# dynamic sampling (algo.oversample): the groups the rollouts drew this step, and how many of them had varied rewards
GROUPS_DRAWN, GROUPS_VARIED = "rollout/groups_drawn", "rollout/groups_varied"
# partial rollouts (schedule.partial_tokens): groups finished this step that an earlier step had set aside, and
# groups this step set aside for the next
GROUPS_CARRIED_IN, GROUPS_CARRIED_OUT = "rollout/groups_carried_in", "rollout/groups_carried_out"
ENTROPY, KL_REF, IS_MEAN = "train/entropy", "train/kl_ref", "train/is/mean"
TOKENS_TRAINED = "train/tokens_trained"
GROUPS = "train/groups"  # the groups (questions) a step trained from, varied or not
# the collapse monitor (searchr1/monitor.py): its moving averages, the rules that flagged this step (FLAG + rule,
# 1.0 each), their count, and COLLAPSE 1.0 once they have flagged monitor.patience steps running
REWARD_MA, ANSWER_MA = "monitor/reward_ma", "monitor/answer_rate_ma"
FLAG, FLAGS, COLLAPSE = "monitor/flag/", "monitor/flags", "monitor/collapse"
ROLLBACK = "monitor/rollback"  # 1.0 on the step after which trainer.on_collapse=rollback restored a checkpoint
SYNC_BYTES, SYNC_FULL_BYTES, SYNC_CHANGED_FRAC = "sync/bytes", "sync/full_bytes", "sync/changed_frac"
STEP_S, USEFUL_FRACTION = "time/step_s", "useful_work_fraction"
USEFUL = ("rollout", "train", "eval")  # phases that count as useful work; the rest is transfer, sync, waiting


class PhaseTimer:
    """Seconds per phase of one rank's step; whatever is not inside a phase is `wait` (for the other role)."""

    def __init__(self):
        self.s = defaultdict(float)
        self.t0 = time.perf_counter()

    @contextmanager
    def __call__(self, phase: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.s[phase] += time.perf_counter() - t

    def add(self, phase: str, seconds: float) -> None:
        self.s[phase] += seconds

    def close(self) -> dict:
        wall = time.perf_counter() - self.t0
        return {**self.s, "wait": max(0.0, wall - sum(self.s.values())), "wall": wall}


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf; a reader sees a missing value, not a parse error
    return value


def lag_metrics(step: int, trajs) -> dict[str, float]:
    """How far behind the weights they are trained into the step's trajectories were generated."""
    lags = [step - t.policy_version for t in trajs if t.turn_versions]
    if not lags:
        return {}
    out = {LAG_MAX: float(max(lags)), LAG_MEAN: sum(lags) / len(lags), VERSION_OLDEST: float(step - max(lags))}
    out.update({f"lag/count/{k}": float(v) for k, v in sorted(Counter(lags).items())})
    return out


def step_record(step: int, trajs, units: list[dict], train_m: dict, pub_m: dict, times: list[dict],
                n_trainer: int) -> dict:
    """The record of training step `step` (0-based; the record says step + 1, the optimizer steps done).
    `units`: each unit's rollout metrics; `times`: every rank's phase seconds (trainers first, with "wall")."""
    rec = {KIND: TRAIN, STEP: step + 1, **trajectory_metrics(trajs), **lag_metrics(step, trajs)}
    seconds = sorted({k for m in units for k in m if k.startswith("rollout/") and k.endswith("_s")})
    summed = (GROUPS_DRAWN, GROUPS_VARIED, GROUPS_CARRIED_IN, GROUPS_CARRIED_OUT)
    for key in seconds + [k for k in summed if any(k in m for m in units)]:
        rec[key] = sum(m.get(key, 0.0) for m in units)
    gen_s = rec.get("rollout/generation_s", 0.0)
    rec["rollout/retrieval_to_generation"] = rec.get("rollout/retrieval_s", 0.0) / gen_s if gen_s else 0.0
    rec.update(train_m)
    rec.update(pub_m)
    useful = wall = 0.0
    for role, members in (("trainer", times[:n_trainer]), ("rollout", times[n_trainer:])):
        if not members:  # elastic rollouts report no phase times: they are not ranks
            continue
        for ph in sorted({k for r in members for k in r}):
            rec[f"time/{role}/{ph}_s"] = sum(r.get(ph, 0.0) for r in members) / len(members)
        useful += sum(r.get(ph, 0.0) for r in members for ph in USEFUL)
        wall += sum(r.get("wall", 0.0) for r in members)
    rec[STEP_S] = times[0].get("wall", 0.0)
    rec[USEFUL_FRACTION] = useful / wall if wall > 0 else 0.0
    return rec


def eval_record(version: int, predictions: list[dict], seconds: float) -> dict:
    """The record of one held-out evaluation of weights `version`, EM split by whether the agent searched."""
    n = len(predictions)
    em = int(sum(p["em"] for p in predictions))
    searched = [p for p in predictions if p["searches"] > 0]
    rec = {KIND: EVAL, STEP: version, EVAL_N: n, EVAL_EM_COUNT: em, EVAL_EM: em / max(n, 1),
           EVAL_F1: sum(p["f1"] for p in predictions) / max(n, 1),
           EVAL_SEARCHES: sum(p["searches"] for p in predictions) / max(n, 1),
           EVAL_SEARCHED_RATE: len(searched) / max(n, 1),
           EVAL_ANSWER_RATE: sum(p.get("prediction") is not None for p in predictions) / max(n, 1),
           "eval/em_count_searched": int(sum(p["em"] for p in searched)), "eval/n_searched": len(searched),
           "eval/seconds_s": seconds}
    return rec


def eval_set_record(dataset: str, version: int, predictions: list[dict], seconds: float) -> dict:
    """The record of one evaluation of weights `version` on the held-out set `dataset` (its own EM and F1)."""
    return {**eval_record(version, predictions, seconds), KIND: EVAL_SET, DATASET: dataset}


def set_records(path: str | Path, dataset: str) -> list[dict]:
    return [r for r in records(path, EVAL_SET) if r.get(DATASET) == dataset]


PREDICTION_COLUMNS = ("step", "id", "question", "gold", "prediction", "em", "f1", "searches", "turns",
                      "stop_reason", "response")


def wandb_init_args(cfg: Config, run_dir: Path, resume_step: int = 0) -> dict | None:
    """wandb.init's arguments, or None when wandb is off (WANDB_MODE wins over wandb.mode, so a cluster's
    WANDB_MODE=online needs no change here). Runs group by experiment, or by sweep (launch.py names the group of
    a -m sweep); tags say what differs between the runs of a group: seed, schedule, algorithm, compute dtype."""
    mode = os.environ.get("WANDB_MODE", cfg.wandb.mode)
    if mode == "disabled":
        return None
    name = Path(run_dir).name
    tags = [f"seed:{cfg.seed}", f"schedule:{cfg.schedule.name}", f"algo:{cfg.algo.name}",
            f"dtype:{cfg.trainer.compute_dtype}", f"experiment:{cfg.experiment}", *cfg.wandb.tags]
    return dict(project=cfg.wandb.project, entity=cfg.wandb.entity or None, mode=mode, dir=str(run_dir),
                name=name, id=name.replace(":", "-"), group=cfg.wandb.group or cfg.experiment,
                job_type=cfg.mode, tags=tags, resume="allow" if resume_step else None,
                config=json.loads(json.dumps(asdict(cfg))))


class MetricsWriter:
    """Only trainer rank 0 writes. `resume_step`: the step a resumed run continues from."""

    def __init__(self, cfg: Config, run_dir: Path, resume_step: int = 0):
        self.path = Path(run_dir) / "metrics.jsonl"
        if resume_step and self.path.exists():
            truncate_after(self.path, resume_step)
        self._file = open(self.path, "a", encoding="utf-8")
        self._wandb = None
        kwargs = wandb_init_args(cfg, run_dir, resume_step)
        if kwargs is not None:
            import wandb

            self._wandb = wandb.init(**kwargs)

    def log(self, record: dict) -> None:
        record = {k: _clean(v) for k, v in record.items()}
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        if self._wandb is not None:
            rename = (lambda k: k.replace("eval/", f"eval/{record[DATASET]}/", 1)) if record.get(KIND) == EVAL_SET \
                else (lambda k: k)  # each set its own wandb panel, beside HotpotQA's eval/
            self._wandb.log({rename(k): v for k, v in record.items() if isinstance(v, (int, float)) and v is not None},
                            step=record.get(STEP))

    def log_predictions(self, step: int, predictions: list[dict], dataset: str = "hotpotqa") -> None:
        """An evaluation's predictions as a wandb Table (one row per question, the whole response included),
        beside the metrics of that step; the jsonl under predictions/ stays the record."""
        if self._wandb is None:
            return
        import wandb

        table = wandb.Table(columns=list(PREDICTION_COLUMNS))
        for p in predictions:
            table.add_data(step, p["id"], p["question"], " | ".join(p["answers"]), p.get("prediction"),
                           float(p["em"]), float(p["f1"]), int(p["searches"]), int(p.get("turns", 0)),
                           p.get("stop_reason", ""), p.get("response", ""))
        key = "eval/predictions" if dataset == "hotpotqa" else f"eval/{dataset}/predictions"
        self._wandb.log({key: table}, step=step)

    def close(self) -> None:
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def truncate_after(path: Path, step: int) -> int:
    """Drop the records past `step` (a resumed run redoes them), atomically; returns how many were dropped.
    A train record of step s is kept for s <= step, an evaluation of version v for v <= step."""
    kept, dropped = [], 0
    for rec in read_metrics(path):
        if rec.get(STEP, 0) <= step:
            kept.append(json.dumps(rec, sort_keys=True))
        else:
            dropped += 1
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    tmp.replace(path)
    return dropped


def read_metrics(path: str | Path) -> list[dict]:
    """Every record of a metrics.jsonl; a torn last line (a crash mid-write) is skipped with a warning, any other
    bad line is an error naming it."""
    out = []
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as err:
            if i == len(lines) - 1:  # the line being written when the run died: nothing after it was written
                log.warning("%s: the last line is torn (a crash mid-write); skipped", path)
                continue
            raise ValueError(f"{path}: line {i + 1} is not valid JSON ({err.msg})") from err
    return out


def records(path: str | Path, kind: str) -> list[dict]:
    return [r for r in read_metrics(path) if r.get(KIND) == kind]
