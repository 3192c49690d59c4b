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


def test_missing_hub_model_says_how_to_get_it(tmp_path):
    cfg = ModelConfig(name="x", source="hub", path=str(tmp_path / "no-such-model"))
    with pytest.raises(ModelNotFound, match="model.path"):
        load_tokenizer(cfg)


def test_hub_source_needs_a_path():
    with pytest.raises(ValueError, match="model.path"):
        ModelConfig(source="hub", path="")
