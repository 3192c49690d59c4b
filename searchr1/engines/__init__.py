"""Rollout engines behind one interface (`base.Engine`), chosen by `engine.name` (searchr1.registry.ENGINES)."""
from __future__ import annotations

from searchr1.config import EngineConfig, ModelConfig
from searchr1.engines.base import Engine, Generation, Sampling


def make_engine(model_cfg: ModelConfig, engine_cfg: EngineConfig, max_model_len: int, device="cpu",
                temperature: float = 1.0) -> Engine:
    """The engine `engine_cfg.name` names, its weights in bf16 (what weight sync writes); `max_model_len` bounds
    prompt plus generation (agent.max_context_tokens); `temperature`: the one sampling calls will use (its
    log-probs are reported under it, engines/base.py)."""
    from searchr1.registry import ENGINES, resolve

    return resolve(ENGINES, engine_cfg.name, "engine.name")(model_cfg, engine_cfg, max_model_len, device,
                                                            temperature)


__all__ = ["Engine", "Generation", "Sampling", "make_engine"]
