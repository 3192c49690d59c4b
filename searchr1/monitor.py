"""A run that notices its own collapse: rules over each RL step's record (monitor.*, searchr1/monitor_config.py).

Search-R1 users' most frequent report is GRPO's reward falling off a cliff after a few hundred steps, found hours
later. The monitor reads what every trainer rank already holds identically (the batch's trajectory statistics
and the all-reduced train/ values), so every replica reaches the same verdict without a message; trainer 0
writes the flags to metrics.jsonl (keys of searchr1/metrics.py) and the progress line, and
`trainer.on_collapse` says what a collapse does (searchr1/roles/trainer.py). Its history is checkpoint state,
so a resumed run judges as the uninterrupted one would.
"""
from __future__ import annotations

from collections import deque

from searchr1 import metrics as K
from searchr1.monitor_config import MonitorConfig


def _mean(xs) -> float:
    return sum(xs) / len(xs)


class Monitor:
    def __init__(self, cfg: MonitorConfig):
        self.cfg = cfg
        self.hist: dict[str, deque] = {k: deque(maxlen=cfg.window)
                                       for k in (K.REWARD, K.ANSWER_RATE, K.ENTROPY, K.GRAD_NORM, K.GROUPS)}
        self.best: dict[str, float] = {}
        self.best_groups = 0.0  # the questions behind the reward's best moving average
        self.seen = self.streak = 0
        self.first_flagged: int | None = None  # the record step where the current run of flagged steps began

    def observe(self, step: int, rec: dict) -> tuple[dict[str, float], list[str]]:
        """Judge record `step` (1-based, as metrics.jsonl numbers it): (the monitor's metrics for the record, the
        reasons it flagged, one line each)."""
        c, out, why = self.cfg, {}, []
        judged = c.enabled and self.seen >= c.warmup_steps
        if K.REWARD in rec and K.GROUPS in rec:
            self.hist[K.GROUPS].append(float(rec[K.GROUPS]))
        for key, drop, name, ma_key in ((K.REWARD, c.reward_drop, "reward", K.REWARD_MA),
                                        (K.ANSWER_RATE, c.answer_drop, "answer_rate", K.ANSWER_MA)):
            if key not in rec:
                continue
            self.hist[key].append(float(rec[key]))
            ma = out[ma_key] = _mean(self.hist[key])
            best = self.best.get(key)
            if judged and drop > 0 and best is not None and best >= c.min_level and ma < (1 - drop) * best \
                    and (key != K.REWARD or self._beyond_noise(best, ma)):
                why.append((name, f"{name} moving average {ma:.3f} fell below {1 - drop:.2f} x its best {best:.3f}"))
            if len(self.hist[key]) == c.window:  # a best over fewer steps is one lucky batch, not a level
                if best is None or ma > best:
                    self.best[key] = ma
                    if key == K.REWARD:
                        self.best_groups = sum(self.hist[K.GROUPS])
        # A step whose groups all scored alike trains no token: its entropy and gradient norm are 0 by construction
        # (seen in the main job), neither a collapse nor part of the averages. The others are judged against the
        # steps before: a spike is not in its own average.
        trained = rec.get(K.TOKENS_TRAINED, 1) > 0
        for key in (K.ENTROPY, K.GRAD_NORM):
            if key not in rec or not trained:
                continue
            x, h = float(rec[key]), self.hist[key]
            m = _mean(h) if h else None
            if judged and m is not None and key == K.ENTROPY and c.entropy_drop > 0 and x < (1 - c.entropy_drop) * m:
                why.append(("entropy", f"entropy {x:.4g} below {1 - c.entropy_drop:.2f} x its moving average {m:.4g}"))
            if judged and m is not None and key == K.GRAD_NORM and c.grad_spike > 0 and x > c.grad_spike * m:
                why.append(("grad_norm", f"gradient norm {x:.4g} above {c.grad_spike:g} x its moving average {m:.4g}"))
            h.append(x)
        if judged and c.max_kl > 0 and rec.get(K.KL_REF, 0.0) > c.max_kl:
            why.append(("kl", f"KL to the reference {rec[K.KL_REF]:.4g} above monitor.max_kl={c.max_kl:g}"))
        if judged and c.max_is_mismatch > 0 and K.IS_MEAN in rec and abs(rec[K.IS_MEAN] - 1) > c.max_is_mismatch:
            why.append(("is_mismatch", f"engine/trainer importance weight mean {rec[K.IS_MEAN]:.4g} is more than "
                                       f"monitor.max_is_mismatch={c.max_is_mismatch:g} from 1"))
        self.seen += 1
        self.streak = self.streak + 1 if why else 0
        if why and self.streak == 1:
            self.first_flagged = step
        out.update({K.FLAG + name: 1.0 for name, _ in why})
        out[K.FLAGS] = float(len(why))
        out[K.COLLAPSE] = float(self.collapsed)
        return out, [line for _, line in why]

    def _beyond_noise(self, best: float, ma: float) -> bool:
        """The reward's fall from its best is more than monitor.reward_z standard errors of the two windows' means,
        with a question (a group) as the unit: a step's reward is the mean over a few questions whose difficulty
        differs far more than its samples do, so at 4 questions a step a window's mean moves by half from one draw
        of questions to the next (tests/test_monitor.py replays the committed runs). Without group counts in the
        records (or reward_z 0) the fall alone decides, as it always did."""
        n_best, n_now = self.best_groups, sum(self.hist[K.GROUPS])
        if self.cfg.reward_z <= 0 or n_best <= 0 or n_now <= 0:
            return True
        p = min(max((best * n_best + ma * n_now) / (n_best + n_now), 0.0), 1.0)
        return best - ma > self.cfg.reward_z * (p * (1 - p) * (1 / n_best + 1 / n_now)) ** 0.5

    @property
    def collapsed(self) -> bool:
        return self.cfg.enabled and self.streak >= self.cfg.patience

    def state_dict(self) -> dict:
        return {"hist": {k: list(v) for k, v in self.hist.items()}, "best": dict(self.best), "seen": self.seen,
                "streak": self.streak, "first_flagged": self.first_flagged, "best_groups": self.best_groups}

    def load_state_dict(self, sd: dict) -> None:
        for k, v in sd["hist"].items():
            self.hist[k] = deque(v, maxlen=self.cfg.window)
        self.best, self.seen, self.streak = dict(sd["best"]), int(sd["seen"]), int(sd["streak"])
        self.first_flagged = sd["first_flagged"]
        self.best_groups = float(sd.get("best_groups", 0.0))  # checkpoints before it: the fall alone decides
