"""GRPO behind the learner's algorithm interface: per-trajectory advantages, then each micro-batch's loss.

The learner (searchr1/learner.py) owns the model, the replicas and the micro-batching; an algorithm says which
coefficient each trajectory gets, which rows need a forward pass at all, and what loss a micro-batch of rows
contributes. The tensor math is searchr1/grpo.py's pure functions.

Every sum a micro-batch returns is additive over micro-batches and replicas (the learner all-reduces them), so
the step's statistics are those of the whole batch, whatever the sharding.
"""
from __future__ import annotations

import torch

from searchr1 import grpo
from searchr1.config import AlgoConfig
from searchr1.trajectory import Trajectory


class GRPO:
    # the statistics of a micro-batch, in this order: summed (SUMS) or maxed (MAXES) over micro-batches and
    # replicas by the learner
    SUMS = ("loss", "clip_tokens", "approx_kl_tokens", "entropy", "kl", "tokens", "rows", "is_sum", "is_sq_sum",
            "is_truncated")
    MAXES = ("is_max",)
    sampled = True  # trains on sampled data: log-probs at the sampling temperature

    def __init__(self, cfg: AlgoConfig):
        self.cfg = cfg
        self.needs_reference = cfg.kl_coef > 0  # a frozen copy of the initial policy, for the KL term
        # the decoupled objective's proximal policy, once a batch has several updates (ppo_epochs x minibatches)
        self.needs_proximal = cfg.off_policy == "decoupled"

    def build_critic(self, policy: torch.nn.Module) -> torch.nn.Module | None:
        return None  # no trainable state beside the policy

    def coefficients(self, trajs: list[Trajectory]) -> tuple[torch.Tensor, dict[str, float]]:
        """Group-relative advantages (float32, one per trajectory) and their statistics."""
        reward_b = torch.tensor([t.reward for t in trajs], dtype=torch.float64)
        group_b = torch.tensor([t.group for t in trajs])
        adv_b, n_zero = grpo.group_advantages(reward_b, group_b, self.cfg.normalize_std, self.cfg.adv_eps)
        stats = {"adv_mean": float(adv_b.mean()), "adv_std": float(adv_b.std()) if len(trajs) > 1 else 0.0,
                 "adv_abs_max": float(adv_b.abs().max()), "zero_adv_groups": float(n_zero),
                 "groups": float(torch.unique(group_b).numel()), "reward_mean": float(reward_b.mean())}
        return adv_b, stats

    def trains(self, adv: float) -> bool:
        """Whether a row needs a forward/backward pass. A zero-advantage row adds exactly zero gradient to the
        clipped loss, so it is skipped unless a KL or entropy term needs it (the loss denominator still counts
        it, so the update is unchanged)."""
        return self.needs_reference or self.cfg.entropy_coef > 0 or adv != 0

    def micro_loss(self, logp_bt: torch.Tensor, logits_nv: torch.Tensor, mb: dict, denom: float,
                   ref_logp_bt: torch.Tensor | None, temperature: float = 1.0
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(the micro-batch's share of the step's loss, its sums by name; the learner adds `entropy`).

        `logits_nv` are the trained positions' logits (for the entropy bonus); `ref_logp_bt` the frozen
        reference's log-probs when `needs_reference`."""
        a, mask_bt = self.cfg, mb["mask_bt"]
        adv = mb["adv_bt"] if "adv_bt" in mb else mb["adv_b"]  # per token (a critic's) or per trajectory
        if a.off_policy == "decoupled":
            # prox_bt: the policy before this batch's first update, given when the batch has several
            loss, st = grpo.decoupled_policy_loss(logp_bt, mb["old_bt"], adv, mask_bt, a.clip_eps, a.is_cap,
                                                  a.loss_agg, denom, mb.get("prox_bt"))
        else:
            loss, st = grpo.policy_loss(logp_bt, mb["old_bt"], adv, mask_bt, a.clip_eps, a.loss_agg, denom)
            with torch.no_grad():  # the same weights, reported: how far behaviour and trainer disagree
                on_bt = mask_bt.bool()
                w_bt = torch.exp(torch.where(on_bt, logp_bt - mb["old_bt"], torch.zeros_like(logp_bt)).clamp(max=20))
                st.update(grpo.importance_stats(w_bt, on_bt, a.is_cap))
        kl_sum = torch.zeros((), device=logp_bt.device)
        if ref_logp_bt is not None:
            kl_bt = grpo.kl_penalty(logp_bt, ref_logp_bt, mask_bt, a.kl_estimator)
            loss = loss + a.kl_coef * grpo.masked_aggregate(kl_bt, mask_bt, a.loss_agg, denom)
            kl_sum = kl_bt.detach().sum()
        if a.entropy_coef > 0:
            ent_bt = torch.zeros_like(logp_bt).masked_scatter(mask_bt.bool(),
                                                              grpo.token_entropy(logits_nv[None], temperature)[0])
            loss = loss - a.entropy_coef * grpo.masked_aggregate(ent_bt, mask_bt, a.loss_agg, denom)
        n = st["tokens"].float()
        return loss, {"loss": loss.detach(), "clip_tokens": st["clip_frac"] * n,
                      "approx_kl_tokens": st["approx_kl"] * n, "kl": kl_sum, "tokens": n,
                      "rows": torch.tensor(float(mask_bt.shape[0]), device=logp_bt.device),
                      **{k: st[k] for k in ("is_sum", "is_sq_sum", "is_truncated", "is_max")}}

    def summarize(self, sums: dict[str, float]) -> dict[str, float]:
        n = max(sums["tokens"], 1)
        out = {"loss": sums["loss"], "clip_frac": sums["clip_tokens"] / n, "approx_kl": sums["approx_kl_tokens"] / n,
               "entropy": sums["entropy"] / n, "tokens_trained": sums["tokens"], "seqs_trained": sums["rows"],
               # importance weights over trained tokens as measured, untruncated: pi_trainer / pi_behav (ratio), or
               # pi_prox / pi_behav (decoupled); is/mean is the measured mismatch, is/truncated_frac the share above
               # is_cap, which the decoupled objective clamps (one update per batch) or drops (several)
               "is/mean": sums["is_sum"] / n, "is/max": sums["is_max"], "is/truncated_frac": sums["is_truncated"] / n,
               "is/ess": sums["is_sum"] ** 2 / (n * sums["is_sq_sum"]) if sums["is_sq_sum"] > 0 else 1.0}
        if self.needs_reference:
            out["kl_ref"] = sums["kl"] / n
        return out
