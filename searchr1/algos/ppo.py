"""PPO with a critic behind the learner's algorithm interface: a value head, GAE, a clipped value loss.

The critic is a linear head on the policy's last hidden state at the trained positions (the state from which
each of the policy's tokens is sampled); the learner trains it beside the policy and checkpoints it. Advantages
are GAE over the policy's own tokens only: retrieved <information> tokens are the environment's reply, so the
recursion steps over them (a token's successor is the policy's next token, wherever it is) and they get
neither policy nor value loss. The reward is terminal, on each trajectory's last trained token. The policy
loss is GRPO's clipped one (searchr1/algos/grpo.py) with these per-token advantages; `gae` and `value_loss`
are pure functions, as searchr1/grpo.py's are.
"""
from __future__ import annotations

import torch

from searchr1 import grpo
from searchr1.algos.grpo import GRPO
from searchr1.config import AlgoConfig
from searchr1.trajectory import Trajectory


def gae(values_bt: torch.Tensor, reward_b: torch.Tensor, mask_bt: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns) per trained token, 0 elsewhere; GAE(gamma, lambda) over each row's trained tokens.

    A row's reward is received at its last trained token, after which the episode ends (next value 0).
    Untrained positions (mask 0: information blocks, padding) are skipped: the TD error of a trained token uses
    the value of the row's next trained token. Returns are advantages + values (the critic's targets)."""
    if values_bt.shape != mask_bt.shape or reward_b.shape != values_bt.shape[:1]:
        raise ValueError(f"values_bt {tuple(values_bt.shape)}, mask_bt {tuple(mask_bt.shape)} and reward_b "
                         f"{tuple(reward_b.shape)} must be [B, T], [B, T] and [B]")
    on_bt = mask_bt.bool()
    n_b, n_t = values_bt.shape
    pos_t = torch.arange(n_t, device=values_bt.device)
    last_b = torch.where(on_bt, pos_t, torch.full_like(pos_t, -1)).max(dim=1).values if n_t else pos_t[:0]
    reward_bt = torch.where(pos_t[None] == last_b[:, None], reward_b.to(values_bt.dtype)[:, None],
                            torch.zeros_like(values_bt))
    adv_bt = torch.zeros_like(values_bt)
    next_v_b = torch.zeros(n_b, dtype=values_bt.dtype, device=values_bt.device)
    next_a_b = torch.zeros_like(next_v_b)
    for t in reversed(range(n_t)):
        on_b = on_bt[:, t]
        a_b = reward_bt[:, t] + gamma * next_v_b - values_bt[:, t] + gamma * lam * next_a_b
        adv_bt[:, t] = torch.where(on_b, a_b, torch.zeros_like(a_b))
        next_v_b = torch.where(on_b, values_bt[:, t], next_v_b)
        next_a_b = torch.where(on_b, a_b, next_a_b)
    ret_bt = torch.where(on_bt, adv_bt + values_bt, torch.zeros_like(values_bt))
    return adv_bt, ret_bt


def value_loss(values_bt: torch.Tensor, old_values_bt: torch.Tensor, ret_bt: torch.Tensor, mask_bt: torch.Tensor,
               clip: float, agg: str, denom: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped value loss, 0.5 * max((V - R)^2, (V_clip - R)^2) with V_clip = V_old + clip(V - V_old, +-clip),
    aggregated over trained tokens as the policy loss is. Stats (detached sums over trained tokens): clipped
    tokens (where the clipped branch is the larger), squared errors (V - R)^2, returns and squared returns."""
    on_bt = mask_bt.bool()
    v_clip_bt = old_values_bt + torch.clamp(values_bt - old_values_bt, -clip, clip)
    err_bt = (values_bt - ret_bt) ** 2
    err_clip_bt = (v_clip_bt - ret_bt) ** 2
    loss = grpo.masked_aggregate(0.5 * torch.maximum(err_bt, err_clip_bt), mask_bt, agg, denom)
    with torch.no_grad():
        stats = {"vf_clip_tokens": ((err_clip_bt > err_bt) & on_bt).sum().float(), "vf_err_sq": err_bt[on_bt].sum(),
                 "ret_sum": ret_bt[on_bt].sum(), "ret_sq_sum": (ret_bt[on_bt] ** 2).sum(),
                 "vf_loss": loss.detach()}
    return loss, stats


class ValueHead(torch.nn.Module):
    """V(s) = w . h + b on the policy's last hidden state, from zero (every value starts at 0). `trunk_grad`
    false: the head sees the hidden state detached, so the value loss never moves the policy's layers."""

    def __init__(self, hidden_size: int, trunk_grad: bool):
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)
        self.trunk_grad = trunk_grad

    def forward(self, h_nd: torch.Tensor) -> torch.Tensor:
        return self.linear(h_nd if self.trunk_grad else h_nd.detach()).squeeze(-1).float()


class PPO(GRPO):
    VALUE_SUMS = ("vf_loss", "vf_clip_tokens", "vf_err_sq", "ret_sum", "ret_sq_sum")
    SUMS = GRPO.SUMS + VALUE_SUMS
    MAXES = GRPO.MAXES

    def build_critic(self, policy: torch.nn.Module) -> torch.nn.Module:
        return ValueHead(policy.config.hidden_size, self.cfg.critic_trunk_grad)

    def coefficients(self, trajs: list[Trajectory]) -> tuple[torch.Tensor, dict[str, float]]:
        """Each trajectory's reward (the terminal reward GAE spreads over its tokens)."""
        reward_b = torch.tensor([t.reward for t in trajs], dtype=torch.float32)
        return reward_b, {"reward_mean": float(reward_b.mean())}

    def trains(self, coef) -> bool:
        return True  # a critic's advantages are rarely exactly 0, and its value loss needs every row

    def token_coefficients(self, values_n: list[torch.Tensor], reward_b: torch.Tensor, reduce
                           ) -> tuple[list[torch.Tensor], list[torch.Tensor], dict[str, float]]:
        a = self.cfg
        lens = [len(v) for v in values_n]
        device = reward_b.device
        mask_bt = torch.zeros((len(lens), max(lens, default=0)), device=device)
        values_bt = torch.zeros_like(mask_bt)
        for i, v in enumerate(values_n):
            mask_bt[i, :lens[i]] = 1
            values_bt[i, :lens[i]] = v
        adv_bt, ret_bt = gae(values_bt, reward_b, mask_bt, a.gamma, a.gae_lambda)
        on_bt = mask_bt.bool()
        # batch-wide (every replica's tokens): the whitening must not depend on the sharding
        s = reduce(torch.stack([on_bt.sum().float(), adv_bt[on_bt].sum(), (adv_bt[on_bt] ** 2).sum(),
                                values_bt[on_bt].sum(), ret_bt[on_bt].sum()]).double()).tolist()
        n = max(s[0], 1.0)
        mean, var = s[1] / n, max(s[2] / n - (s[1] / n) ** 2, 0.0)
        stats = {"adv_mean": mean, "adv_std": var**0.5, "value_mean": s[3] / n, "return_mean": s[4] / n}
        if a.whiten_advantages:
            adv_bt = torch.where(on_bt, (adv_bt - mean) / (var**0.5 + a.adv_eps), torch.zeros_like(adv_bt))
        return ([adv_bt[i, :k] for i, k in enumerate(lens)], [ret_bt[i, :k] for i, k in enumerate(lens)], stats)

    def micro_loss(self, logp_bt: torch.Tensor, logits_nv: torch.Tensor, mb: dict, denom: float,
                   ref_logp_bt: torch.Tensor | None, temperature: float = 1.0
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss, sums = super().micro_loss(logp_bt, logits_nv, mb, denom, ref_logp_bt, temperature)
        vl, st = value_loss(mb["values_bt"], mb["old_values_bt"], mb["ret_bt"], mb["mask_bt"], self.cfg.value_clip,
                            self.cfg.loss_agg, denom)
        loss = loss + self.cfg.vf_coef * vl
        return loss, {**sums, "loss": loss.detach(), **st}

    def summarize(self, sums: dict[str, float]) -> dict[str, float]:
        out = super().summarize(sums)
        n = max(sums["tokens"], 1)
        var_ret = sums["ret_sq_sum"] / n - (sums["ret_sum"] / n) ** 2
        out.update({"vf_loss": sums["vf_loss"], "vf_clip_frac": sums["vf_clip_tokens"] / n,
                    # 1: the critic explains the returns; 0: no better than their mean
                    "value/explained_var": 1 - (sums["vf_err_sq"] / n) / var_ret if var_ret > 0 else 0.0})
        return out
