"""Supervised warm start: the negative log-likelihood of scripted trajectories, on generated tokens only.

The same learner, the same masks as RL: information blocks are inserted text and get no loss, so the model
learns to write the protocol's turns (think, search, answer) around retrieved passages, never to produce them.
"""
from __future__ import annotations

import torch

from searchr1 import grpo
from searchr1.config import AlgoConfig
from searchr1.trajectory import Trajectory


class SFT:
    SUMS = ("loss", "nll_tokens", "entropy", "tokens", "rows")
    MAXES = ()
    needs_reference = False
    needs_proximal = False
    sampled = False  # scripted targets: the model's own distribution

    def __init__(self, cfg: AlgoConfig):
        self.cfg = cfg

    def build_critic(self, policy: torch.nn.Module) -> None:
        return None

    def coefficients(self, trajs: list[Trajectory]) -> tuple[torch.Tensor, dict[str, float]]:
        return torch.ones(len(trajs)), {}

    def trains(self, coef) -> bool:
        return True

    def micro_loss(self, logp_bt: torch.Tensor, logits_nv: torch.Tensor, mb: dict, denom: float,
                   ref_logp_bt: torch.Tensor | None, temperature: float = 1.0
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask_bt = mb["mask_bt"]
        loss = -grpo.masked_aggregate(logp_bt, mask_bt, self.cfg.loss_agg, denom)
        on_bt = mask_bt.bool()
        return loss, {"loss": loss.detach(), "nll_tokens": -logp_bt.detach()[on_bt].sum(),
                      "tokens": on_bt.sum().float(),
                      "rows": torch.tensor(float(mask_bt.shape[0]), device=logp_bt.device)}

    def summarize(self, sums: dict[str, float]) -> dict[str, float]:
        n = max(sums["tokens"], 1)
        return {"loss": sums["loss"], "nll": sums["nll_tokens"] / n, "entropy": sums["entropy"] / n,
                "tokens_trained": sums["tokens"], "seqs_trained": sums["rows"]}
