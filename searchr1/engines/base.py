"""The engine interface: token ids in, token ids and log-probs out, live weights exposed for in-place sync.

The temperature contract, stated here once: for every sampled token both engines report its log-probability
under the distribution it was sampled from, log-softmax(logits / T) at the sampling temperature T, and the
trainer recomputes exactly that quantity (searchr1/learner.py, at sampling.temperature). Top-p truncation is
not part of it, so training refuses top_p < 1 (searchr1/config.py). Greedy calls (temperature 0, evaluation)
report temperature-1 log-probs, which nothing trains on.

Seeds: a batch with `seed=s` gives prompt i the seed s+i, so that identical prompts in a GRPO group still draw
different samples while a rerun with the same seed reproduces the batch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

FINISH_REASONS = ("stop", "eos", "length")


@dataclass
class Sampling:
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop: list[str] = field(default_factory=list)  # generation ends once the decoded text contains one
    seed: int | None = None

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"Sampling.temperature={self.temperature!r}: must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"Sampling.top_p={self.top_p!r}: must be in (0, 1]")
        if self.max_new_tokens < 1:
            raise ValueError(f"Sampling.max_new_tokens={self.max_new_tokens!r}: must be >= 1")
        if any(not s for s in self.stop):
            raise ValueError(f"Sampling.stop={self.stop!r}: stop strings must be non-empty")


@dataclass
class Generation:
    token_ids: list[int]  # exactly as sampled, the EOS token included when the model produced it
    logprobs: list[float]  # per token, under the temperature-1 model distribution
    finish_reason: str  # "stop" (a stop string appeared) | "eos" | "length"

    def __post_init__(self):
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"Generation: {len(self.token_ids)} token ids but {len(self.logprobs)} logprobs")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"Generation.finish_reason={self.finish_reason!r}: must be one of {FINISH_REASONS}")


class Engine(Protocol):
    tokenizer: object
    compute_dtype: torch.dtype  # what its matrix products run in (its weights travel in bf16 whatever this is)

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[Generation]:
        """One Generation per prompt, in order; all prompts run as one batch."""
        ...

    def weight_views(self) -> dict[str, torch.Tensor]:
        """HF parameter name -> a bf16 tensor of the HF shape that aliases the engine's live weights (tied
        weights under their first name only). Writing into a view in place changes the next generate()."""
        ...


class Bf16Mirror:
    """bf16 copies of an engine's compute weights, for an engine that computes in fp32.

    Weight sync writes bf16 bits in place; `views()` are those bf16 tensors (HF names and shapes). Before each
    generation `refresh()` copies every view that was written since into its fp32 compute tensor: bf16 -> fp32
    is exact, so the engine computes with exactly the published weights. In-place writes bump a tensor's
    version counter, which is how a written view is found without comparing values."""

    def __init__(self, compute: dict[str, torch.Tensor]):
        self.compute = compute
        self.masters = {name: t.detach().to(torch.bfloat16).contiguous() for name, t in compute.items()}
        self.seen = {name: t._version for name, t in self.masters.items()}

    def views(self) -> dict[str, torch.Tensor]:
        return self.masters

    def refresh(self) -> int:
        """Copy the written masters into the compute tensors; returns how many were copied."""
        copied = 0
        for name, t in self.masters.items():
            if t._version != self.seen[name]:
                self.compute[name].copy_(t)
                self.seen[name] = t._version
                copied += 1
        return copied


def check_prompts(prompts: list[list[int]], vocab_size: int) -> None:
    """Reject what would otherwise fail deep inside an engine, naming the prompt."""
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompt {i} is empty")
        bad = [t for t in p if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt {i} has token ids outside [0, {vocab_size}): {bad[:5]}")
