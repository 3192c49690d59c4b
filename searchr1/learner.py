"""The learner: a policy in fp32 master weights, AdamW, DDP over the trainer replicas, micro-batches.

Every trainer rank holds the same full list of the step's trajectories. The algorithm's per-trajectory
coefficients and the loss denominators come from that full list, so each replica only has to train on its
shard: with DDP averaging the gradients, the update equals that of one replica on the whole batch (to float
tolerance), whatever the sharding and the micro-batching. The objective itself is the algorithm's
(searchr1/algos, chosen by `algo.name`); the learner exports bf16 copies of its weights and knows nothing about
how they travel, nor where checkpoints live (searchr1/checkpoint.py writes what `state_dict` returns).
"""
from __future__ import annotations

import contextlib
import gc
import logging
import random

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from searchr1 import grpo, placement
from searchr1.batching import collate, minibatches, pack_micro_batches, shard_indices  # noqa: F401 (re-exported)
from searchr1.config import AlgoConfig, ModelConfig, OptimConfig, TrainerConfig
from searchr1.models import load_model
from searchr1.registry import ALGORITHMS, resolve
from searchr1.trajectory import Trajectory

log = logging.getLogger(__name__)


class TrainedLogits(torch.nn.Module):
    """A causal LM's logits at the given (row, position) pairs only: the decoder on every token, the output
    layer on the trained positions. In a Search-R1 batch most positions are prompt or information tokens,
    whose [tokens, vocab] logits the loss never reads; computing them was 15% of a CPU warm-start step.
    DDP wraps this module, so the replicas' gradients are reduced as for the model itself, an algorithm's
    critic (attached as `critic`, on the same hidden states) included: it then returns (logits, values)."""

    def __init__(self, policy: torch.nn.Module):
        super().__init__()
        for key in ("final_logit_softcapping", "logit_scale"):  # an output transform the lm_head alone lacks
            if getattr(policy.config, key, None):
                raise ValueError(f"model config sets {key}={getattr(policy.config, key)}: the learner applies "
                                 "only the output layer to the trained positions' hidden states")
        self.policy = policy

    def forward(self, ids_bt: torch.Tensor, rows_n: torch.Tensor, cols_n: torch.Tensor) -> torch.Tensor:
        h_btd = self.policy.get_decoder()(input_ids=ids_bt, use_cache=False).last_hidden_state
        h_nd = h_btd[rows_n, cols_n]
        logits_nv = self.policy.get_output_embeddings()(h_nd)
        critic = getattr(self, "critic", None)
        return logits_nv if critic is None else (logits_nv, critic(h_nd))


class Learner:
    def __init__(self, model_cfg: ModelConfig, algo: AlgoConfig, optim: OptimConfig, trainer: TrainerConfig, device,
                 group: dist.ProcessGroup | None = None, seed: int = 0, temperature: float = 1.0,
                 train_top_layers: int | None = None):
        """`group`: the trainer replicas' process group (None or size 1: no DDP). `seed` seeds the process's
        torch, numpy and python RNGs (the trainer role owns its process). `temperature`: the rollouts' sampling
        temperature, at which the behaviour log-probs were reported and are recomputed (engines/base.py)."""
        if temperature <= 0:
            raise ValueError(f"sampling.temperature={temperature}: training needs sampled log-probs (> 0)")
        self.cfg, self.device, self.model_cfg, self.temperature = trainer, torch.device(device), model_cfg, temperature
        self.group = group
        self.world = dist.get_world_size(group) if group is not None else 1
        self.rank = dist.get_rank(group) if group is not None else 0
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        model, self.tokenizer = load_model(model_cfg, dtype=torch.float32)
        self.module = model.to(self.device).train()
        self.module.config.use_cache = False
        top = trainer.train_top_layers if train_top_layers is None else train_top_layers
        if top:
            _freeze_below(self.module, top)
        if trainer.gradient_checkpointing:
            # non-reentrant: the reentrant variant breaks DDP's gradient hooks under no_sync
            self.module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.vocab = self.module.get_input_embeddings().num_embeddings
        dtype, why = placement.compute_dtype(trainer.compute_dtype, self.device)
        log.info("trainer computes in %s (%s); master weights fp32", dtype, why)
        self.compute_dtype = None if dtype == torch.float32 else dtype
        self.compute_dtype_name = str(dtype).removeprefix("torch.")
        self.scorer = TrainedLogits(self.module)
        self.ddp = self.critic = None  # DDP wraps the scorer once the stage's critic (if any) is attached
        self.step_count = 0
        self.restart(algo, optim)

    def restart(self, algo: AlgoConfig, optim: OptimConfig, train_top_layers: int | None = None) -> None:
        """Begin a stage: the objective `algo.name` with a fresh optimizer (a warm start's Adam moments do not
        carry into RL), training the top `train_top_layers` layers (0: all; None: as they are). A KL reference
        is the policy as it is now: the start of this stage."""
        # The last stage's optimizer state, gradient buckets and reference go before this stage's are built: at a
        # warm start's end its Adam moments of every parameter are the trainer's largest allocation, and holding
        # them while the reference loads took the CPU demo's four ranks past the machine's 24 GiB (rank 0 OOM-killed).
        self.optimizer = self.scheduler = self.ref = None
        gc.collect()
        # DDP hooks the parameters that need gradients when it wraps the model: wrapped anew when they change
        rewrap = self.ddp is None
        if train_top_layers is not None:
            before = [p.requires_grad for p in self.module.parameters()]
            if train_top_layers:
                _freeze_below(self.module, train_top_layers)
            else:
                self.module.requires_grad_(True)
            rewrap |= before != [p.requires_grad for p in self.module.parameters()]
        self.algo = resolve(ALGORITHMS, algo.name, "algo.name")(algo)
        # the algorithm's own trainable state (PPO's critic): fresh at each stage, like the optimizer
        critic = self.algo.build_critic(self.module)
        if critic is not None or self.critic is not None:
            rewrap = True
            if self.critic is not None:
                del self.scorer.critic
            if critic is not None:
                self.scorer.critic = critic.to(self.device).train()
        self.critic = self.scorer.critic if critic is not None else None
        if self.world > 1 and rewrap:
            idx = [self.device.index] if self.device.type == "cuda" else None
            self.ddp = None  # its buckets are freed before the new wrapper allocates its own
            gc.collect()
            self.ddp = DistributedDataParallel(self.scorer, process_group=self.group, device_ids=idx)
        # sampled data is scored at its sampling temperature; supervised targets at the model's own (1)
        self.t = self.temperature if self.algo.sampled else 1.0
        self.ref = None
        # the step whose policy is the reference: 0 is the base model; later (RL after a warm start) it is
        # state that a checkpoint must carry (searchr1/checkpoint.py), since no file of the model holds it
        self.ref_step = self.step_count
        if self.algo.needs_reference:
            ref, _ = load_model(self.model_cfg, dtype=self.compute_dtype or torch.float32)
            ref.load_state_dict(self.module.state_dict())
            self.ref = TrainedLogits(ref.to(self.device).eval().requires_grad_(False))
        params = self.module.parameters()
        if self.critic is not None:  # its own learning rate, under the same schedule
            params = [{"params": list(params)}, {"params": list(self.critic.parameters()), "lr": algo.critic_lr}]
        self.optimizer = torch.optim.AdamW(params, lr=optim.lr, betas=tuple(optim.betas),
                                           weight_decay=optim.weight_decay)
        self.grad_clip, warmup = optim.grad_clip, optim.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup > 0 else 1.0)

    def scale_lr(self, factor: float) -> None:
        """Every learning rate multiplied by `factor` from now on (the schedule's base rates with them)."""
        for g in self.optimizer.param_groups:
            g["lr"] *= factor
        self.scheduler.base_lrs = [b * factor for b in self.scheduler.base_lrs]

    @property
    def model(self) -> torch.nn.Module:
        """The unwrapped policy (fp32 master weights)."""
        return self.module

    def _autocast(self):
        if self.compute_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    def _check(self, trajs: list[Trajectory]) -> None:
        if not trajs:
            raise ValueError("Learner.step got no trajectories")
        for t in trajs:
            if not t.prompt_ids:
                raise ValueError(f"trajectory {t.qid}: empty prompt_ids (the first response token needs a context)")
            bad = [x for x in t.prompt_ids + t.response_ids if not 0 <= x < self.vocab]
            if bad:
                raise ValueError(f"trajectory {t.qid}: token ids {bad[:5]} outside the vocabulary [0, {self.vocab})")

    def _logprobs(self, net, mb: dict) -> tuple[torch.Tensor, torch.Tensor]:
        return self._score(net, mb)[:2]

    def _score(self, net, mb: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(log-probs at the trained positions, scattered into a zero `_bt` tensor; those positions' logits;
        the critic's values there, scattered likewise, or None without a critic).

        Only trained positions reach the float32 log-softmax: information blocks and padding can be most of a
        Search-R1 response, and the [tokens, vocab] float32 tensors are the trainer's largest activations.
        At the sampling temperature: the behaviour log-probs' distribution (searchr1/engines/base.py)."""
        on_bt = mb["mask_bt"].bool()
        rows_n, cols_n = on_bt.nonzero(as_tuple=True)  # row-major: the order of on_bt's True entries
        with self._autocast():
            out = net(mb["ids_bt"], rows_n, cols_n + mb["start"])
        logits_nv, values_n = out if isinstance(out, tuple) else (out, None)
        logp_n = grpo.token_logprobs(logits_nv[None], mb["target_bt"][on_bt][None], self.t)[0]
        values_bt = None
        if values_n is not None:
            values_bt = torch.zeros(on_bt.shape, device=self.device).masked_scatter(on_bt, values_n.float())
        return torch.zeros(on_bt.shape, device=self.device).masked_scatter(on_bt, logp_n), logits_nv, values_bt

    def _entropy_sum(self, logits_nv: torch.Tensor) -> torch.Tensor:
        """Summed entropy of the trained positions, chunked: a full softmax copy of the logits is not needed."""
        with torch.no_grad():
            return sum((grpo.token_entropy(c[None], self.t).sum() for c in logits_nv.split(1024)),
                       torch.zeros((), device=self.device))

    def _micro_step(self, mb: dict, denom: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward + backward of one micro-batch; returns its SUMS and MAXES (the algorithm's order)."""
        logp_bt, logits_nv, values_bt = self._score(self.ddp or self.scorer, mb)
        if values_bt is not None:
            mb["values_bt"] = values_bt  # the critic's, with their graph
        ref_logp_bt = None
        if self.ref is not None:
            with torch.no_grad():
                ref_logp_bt, _ = self._logprobs(self.ref, mb)
        loss, sums = self.algo.micro_loss(logp_bt, logits_nv, mb, denom, ref_logp_bt, self.t)
        # DDP averages gradients over the replicas; each replica's loss already carries the global denominator.
        (loss * self.world).backward()
        sums["entropy"] = self._entropy_sum(logits_nv.detach())
        maxes = [sums[k].reshape(()) for k in self.algo.MAXES]
        return (torch.stack([sums[k] for k in self.algo.SUMS]),
                torch.stack(maxes) if maxes else torch.zeros(0, device=self.device))

    def step(self, trajs: list[Trajectory]) -> dict[str, float]:
        """One batch: the step's full list of trajectories (identical on every trainer rank), `algo.ppo_epochs`
        passes over it of `algo.minibatches` optimizer steps each; returns `train/`-namespaced metrics."""
        self._check(trajs)
        coef_b, algo_m = self.algo.coefficients(trajs)
        cfg = self.algo.cfg
        mask_rows = [torch.tensor(t.loss_mask, dtype=torch.float32).reshape(1, -1) for t in trajs]
        den_i = [grpo.loss_denominator(m, cfg.loss_agg) for m in mask_rows]
        denom = sum(den_i)
        train = [i for i, t in enumerate(trajs) if sum(t.loss_mask) > 0 and self.algo.trains(coef_b[i])]
        seq_len = [len(t.prompt_ids) + len(t.response_ids) for t in trajs]
        shards = [[train[k] for k in shard_indices([seq_len[i] for i in train], self.world, r)]
                  for r in range(self.world)]
        epochs, parts = cfg.ppo_epochs, cfg.minibatches
        prep: dict[int, dict[str, torch.Tensor]] = {}
        if self.critic is not None or (epochs * parts > 1 and self.algo.needs_proximal):
            prep = self._before_updates(trajs, shards[self.rank], coef_b, seq_len, algo_m)
        sums = torch.zeros(len(self.algo.SUMS), device=self.device)
        maxes = torch.zeros(len(self.algo.MAXES), device=self.device)
        norms: list[float] = []
        lr = self.optimizer.param_groups[0]["lr"]
        d_train = sum(den_i[i] for i in train)
        for epoch in range(epochs):
            chunks = [minibatches(shard, parts, (self.step_count, epoch, r)) for r, shard in enumerate(shards)]
            for k in range(parts):
                # each minibatch's denominator: its rows' share of the batch's (untrained rows pro rata), so the
                # minibatches of one pass add up to the batch's loss
                den_k = denom if parts == 1 else denom * sum(den_i[i] for c in chunks for i in c[k]) / max(d_train, 1)
                s, m = self._accumulate(trajs, chunks[self.rank][k], coef_b, prep, seq_len, den_k,
                                        any(c[k] for c in chunks))
                sums += s
                maxes = torch.maximum(maxes, m)
                norms.append(self._update(trajs, algo_m))
        if epochs > 1:
            sums /= epochs  # the statistics of one pass over the batch
        if self.group is not None and self.world > 1:
            dist.all_reduce(sums, group=self.group)
            if maxes.numel():
                dist.all_reduce(maxes, op=dist.ReduceOp.MAX, group=self.group)
        self.scheduler.step()
        self.step_count += 1
        stats = {**dict(zip(self.algo.SUMS, sums.tolist())), **dict(zip(self.algo.MAXES, maxes.tolist()))}
        out = {"step": float(self.step_count), **self.algo.summarize(stats),
               "grad_norm": sum(norms) / len(norms), **algo_m,
               "tokens_generated": float(sum(t.generated_tokens for t in trajs)), "lr": lr}
        if len(norms) > 1:
            out.update(updates=float(len(norms)), grad_norm_max=max(norms))
        return {f"train/{k}": v for k, v in out.items()}

    def _before_updates(self, trajs, mine: list[int], coef_b, seq_len, algo_m: dict) -> dict[int, dict]:
        """Per row of this rank's shard, over its trained tokens in order: the policy's log-probs before the
        batch's first update (`prox`, the decoupled objective's proximal policy), and with a critic its values
        (`old_values`) and the algorithm's per-token advantages and returns (`adv`, `ret`)."""
        prep: dict[int, dict[str, torch.Tensor]] = {}
        with torch.no_grad():
            for rows in pack_micro_batches([seq_len[i] for i in mine], self.cfg.micro_batch_tokens):
                idx = [mine[r] for r in rows]
                mb = collate([trajs[i] for i in idx], coef_b[idx], self.pad_id, self.device)
                logp_bt, _, values_bt = self._score(self.scorer, mb)
                on_bt = mb["mask_bt"].bool()
                for j, i in enumerate(idx):
                    prep[i] = {"prox": logp_bt[j][on_bt[j]]}
                    if values_bt is not None:
                        prep[i]["old_values"] = values_bt[j][on_bt[j]]
        if self.critic is not None:
            order = sorted(prep)
            adv_n, ret_n, m = self.algo.token_coefficients([prep[i]["old_values"] for i in order],
                                                           coef_b[order].to(self.device), self._sum_replicas)
            for i, a, r in zip(order, adv_n, ret_n):
                prep[i].update(adv=a, ret=r)
            algo_m.update(m)
        return prep

    def _sum_replicas(self, x: torch.Tensor) -> torch.Tensor:
        """`x` summed over the trainer replicas (an algorithm's batch-wide statistics; every replica calls it)."""
        if self.group is not None and self.world > 1:
            x = x.clone()
            dist.all_reduce(x, group=self.group)
        return x

    def _accumulate(self, trajs, rows: list[int], coef_b, prep: dict, seq_len, denom: float,
                    anyone: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward and backward of this rank's `rows` of one minibatch, in micro-batches; their summed SUMS and
        maxed MAXES. `anyone`: some replica has rows in it (an idle one then joins the gradient all-reduce)."""
        sums = torch.zeros(len(self.algo.SUMS), device=self.device)
        maxes = torch.zeros(len(self.algo.MAXES), device=self.device)
        batches = pack_micro_batches([seq_len[i] for i in rows], self.cfg.micro_batch_tokens)
        for j, b in enumerate(batches):
            idx = [rows[r] for r in b]
            mb = collate([trajs[i] for i in idx], coef_b[idx], self.pad_id, self.device)
            on_bt = mb["mask_bt"].bool()
            for key in prep[idx[0]] if prep else ():
                mb[f"{key}_bt"] = torch.zeros(on_bt.shape, device=self.device).masked_scatter(
                    on_bt, torch.cat([prep[i][key] for i in idx]))
            last = j == len(batches) - 1
            with self.ddp.no_sync() if self.ddp is not None and not last else contextlib.nullcontext():
                s, m = self._micro_step(mb, denom)
            sums += s
            maxes = torch.maximum(maxes, m)
        if not batches and anyone and self.ddp is not None:
            self._idle_backward()  # the other replicas' gradient all-reduce needs this rank too
        return sums, maxes

    def _update(self, trajs: list[Trajectory], algo_m: dict) -> float:
        """One optimizer step on the accumulated gradients; the policy's gradient norm before clipping (the
        critic is clipped on its own, so its loss's scale cannot shrink the policy's step)."""
        for p in self._trained():
            if p.grad is None and p.requires_grad:  # nothing trainable: a zero gradient, as the full batch gives
                p.grad = torch.zeros_like(p)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.grad_clip))
        if not np.isfinite(grad_norm):
            raise FloatingPointError(f"non-finite gradient norm {grad_norm} at step {self.step_count + 1}; "
                                     f"rewards {[t.reward for t in trajs][:8]}...")
        if self.critic is not None:
            algo_m["critic_grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.critic.parameters(),
                                                                              self.grad_clip))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def _trained(self):
        yield from self.module.parameters()
        if self.critic is not None:
            yield from self.critic.parameters()

    def _idle_backward(self) -> None:
        ids = torch.full((1, 1), self.pad_id, dtype=torch.long, device=self.device)
        zero = torch.zeros(1, dtype=torch.long, device=self.device)
        with self._autocast():
            out = self.ddp(ids, zero, zero)
        (sum(x.float().sum() for x in (out if isinstance(out, tuple) else (out,))) * 0.0).backward()

    def bf16_weights(self) -> dict[str, torch.Tensor]:
        """{HF name: contiguous bf16 copy} of the fp32 master, on the trainer's device. Tied tensors appear once,
        under their first name (model.embed_tokens.weight, not lm_head.weight), as in HF safetensors."""
        out, seen = {}, set()
        for name, t in self.module.state_dict().items():
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
            if key in seen:
                continue
            seen.add(key)
            out[name] = t.detach().to(torch.bfloat16).contiguous()
        return out

    def state_dict(self) -> dict:
        """Everything a resumed learner needs beyond the weights: optimizer, scheduler, step, RNG states."""
        rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "step": self.step_count, "rng": rng}

    def load_state_dict(self, sd: dict, weights: dict[str, torch.Tensor]) -> None:
        self.module.load_state_dict(weights)
        self.optimizer.load_state_dict(sd["optimizer"])
        self.scheduler.load_state_dict(sd["scheduler"])
        self.step_count = int(sd["step"])
        rng = sd["rng"]
        torch.set_rng_state(rng["torch"].cpu())
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])
        if self.device.type == "cuda" and "cuda" in rng:
            torch.cuda.set_rng_state(rng["cuda"].cpu(), self.device)

    def barrier(self) -> None:
        """Every replica waits here for the others (rank 0 writing a checkpoint, say)."""
        if self.group is not None and self.world > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            dist.barrier(group=self.group, device_ids=ids)


def _freeze_below(model: torch.nn.Module, top: int) -> None:
    """Train only the last `top` decoder layers and the final norm. Frozen layers below them get no graph at
    all (their inputs need no gradient), so backward and its activations stop at the first trained layer."""
    layers = model.model.layers
    if not 0 < top <= len(layers):
        raise ValueError(f"trainer.train_top_layers={top}: the model has {len(layers)} decoder layers")
    model.requires_grad_(False)
    for module in list(layers[len(layers) - top:]) + [model.model.norm]:
        module.requires_grad_(True)
    log.info("training the last %d of %d decoder layers (%.1fM of %.1fM parameters)", top, len(layers),
             sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6,
             sum(p.numel() for p in model.parameters()) / 1e6)
