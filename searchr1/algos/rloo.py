"""RLOO (REINFORCE leave-one-out) behind the learner's algorithm interface: GRPO's clipped loss with each
trajectory's reward minus the mean of its group's others as its advantage (searchr1/grpo.py rloo_advantages).
A third objective in a few lines is the test that the interface fits: only the coefficients differ."""
from __future__ import annotations

import torch

from searchr1 import grpo
from searchr1.algos.grpo import GRPO
from searchr1.trajectory import Trajectory


class RLOO(GRPO):
    def coefficients(self, trajs: list[Trajectory]) -> tuple[torch.Tensor, dict[str, float]]:
        reward_b = torch.tensor([t.reward for t in trajs], dtype=torch.float64)
        group_b = torch.tensor([t.group for t in trajs])
        adv_b, n_zero = grpo.rloo_advantages(reward_b, group_b)
        adv_b = adv_b.float()
        stats = {"adv_mean": float(adv_b.mean()), "adv_std": float(adv_b.std()) if len(trajs) > 1 else 0.0,
                 "adv_abs_max": float(adv_b.abs().max()), "zero_adv_groups": float(n_zero),
                 "groups": float(torch.unique(group_b).numel()), "reward_mean": float(reward_b.mean())}
        return adv_b, stats
