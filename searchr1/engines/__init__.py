"""Rollout engines behind one interface (`base.Engine`): transformers (`hf`) and vLLM (`vllm`)."""
from __future__ import annotations

import torch

from searchr1.config import ModelConfig, RolloutConfig
from searchr1.engines.base import Engine, Generation, Sampling


def make_engine(model_cfg: ModelConfig, rollout_cfg: RolloutConfig, device: str | torch.device = "cpu") -> Engine:
    """The engine `rollout_cfg.engine` names, holding the policy in bf16 (the dtype weight sync writes)."""
    from searchr1 import models

    if rollout_cfg.engine == "hf":
        from searchr1.engines.hf import HFEngine

        model, tokenizer = models.load_model(model_cfg, dtype=torch.bfloat16)
        return HFEngine(model, tokenizer, device)
    if rollout_cfg.engine == "vllm":
        from searchr1.engines.vllm import VLLMEngine

        return VLLMEngine(models.model_dir(model_cfg), rollout_cfg, device)
    raise ValueError(f"rollout.engine={rollout_cfg.engine!r}: must be hf or vllm")


__all__ = ["Engine", "Generation", "Sampling", "make_engine"]
