"""How a batch of trajectories becomes the learner's work: each replica's shard, the minibatches of a pass, the
micro-batches within a token budget, and the padded tensors of one micro-batch. Pure and deterministic, so every
rank computes every rank's share (searchr1/learner.py relies on that for its denominators)."""
from __future__ import annotations

import torch

from searchr1.trajectory import Trajectory


def shard_indices(lengths: list[int], world: int, rank: int) -> list[int]:
    """This rank's rows: longest first, dealt in a snake order (0,1,..,w-1,w-1,..,0) so that every replica
    gets a similar number of tokens. Deterministic, so every rank computes every rank's shard."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return [i for k, i in enumerate(order) if (k % world if (k // world) % 2 == 0 else world - 1 - k % world) == rank]


def minibatches(rows: list[int], parts: int, seed: tuple[int, ...]) -> list[list[int]]:
    """`rows` dealt into `parts` minibatches in an order drawn from `seed` (the step, the pass, the rank: every
    rank computes every rank's, and a resumed run the same); one part keeps `rows` as they are."""
    if parts == 1:
        return [rows]
    g = torch.Generator().manual_seed(int.from_bytes(repr(seed).encode(), "little") % (2**63))
    order = [rows[i] for i in torch.randperm(len(rows), generator=g).tolist()]
    return [order[k::parts] for k in range(parts)]


def pack_micro_batches(lengths: list[int], budget_tokens: int) -> list[list[int]]:
    """Rows grouped so that rows x longest row (the padded size) stays within the budget; longest first, so
    neighbours have similar lengths. A row longer than the budget on its own still gets its own micro-batch."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= budget_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def collate(trajs: list[Trajectory], adv_b: torch.Tensor, pad_id: int, device) -> dict:
    """Right-padded inputs plus per-position targets, mask and behaviour log-probs.

    Position t of the `_bt` tensors holds the prediction of token start+1+t, where start is the last prompt
    token of the shortest prompt (`start`). No attention mask: with right padding every key a real token may
    attend to under the causal mask is real, so the causal mask alone is exact for every real position, and
    it lets SDPA skip the masked half of the work (a padding mask turns that skipping off; 8% of a CPU
    warm-start step). What the padded positions compute is never read.
    """
    lens = [len(t.prompt_ids) + len(t.response_ids) for t in trajs]
    L, start = max(lens), min(len(t.prompt_ids) for t in trajs) - 1
    ids_bt = torch.full((len(trajs), L), pad_id, dtype=torch.long)
    mask_bt = torch.zeros((len(trajs), L - 1 - start))
    old_bt = torch.zeros((len(trajs), L - 1 - start))
    for i, t in enumerate(trajs):
        ids_bt[i, :lens[i]] = torch.tensor(t.prompt_ids + t.response_ids)
        off = len(t.prompt_ids) - 1 - start
        mask_bt[i, off:off + len(t.response_ids)] = torch.tensor(t.loss_mask, dtype=torch.float32)
        old_bt[i, off:off + len(t.response_ids)] = torch.tensor(t.logprobs, dtype=torch.float32)
    return {"ids_bt": ids_bt.to(device), "target_bt": ids_bt[:, start + 1:].to(device),
            "mask_bt": mask_bt.to(device), "old_bt": old_bt.to(device), "adv_b": adv_b.to(device),
            "start": start}
