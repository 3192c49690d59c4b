"""GPU benchmark, ready for when a device is lent: torch (CUDA) and transformers only, no vLLM.

On one GPU, for a model of Qwen2.5-3B-Instruct's shape (its HF config's fields below; random bf16 weights, so no
download), each as an absolute time and a ratio against a baseline measured in the same run:
 1. the learner's step: searchr1.learner.Learner.step (GRPO, AdamW, fp32 masters, bf16 compute, the production
    experiment's kl_coef, so with its reference model) on synthetic trajectories; model FLOPs / s against one bf16
    matmul of the MLP's shape (the device's practical peak);
 2. the codec on CUDA tensors: that step's bf16 weights before and after (3.09B parameters), encoded by each
    sync.codec format (the torch path, which a CUDA trainer runs) and applied, bit-exact, against copying both
    snapshots on the device (copy2);
 3. the HF engine's generation (searchr1.engines.hf, sampling at temperature 1): decode time per token against
    reading every weight once at the device's measured copy bandwidth.

    python bench/gpu.py           # CUDA, the full shape (< 8 min on one H200); results/bench/gpu.json
    python bench/gpu.py --tiny    # the same code on the CPU with a tiny shape, in seconds (tests/test_bench.py)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Qwen2.5-3B-Instruct's config.json (conf/model/qwen2_5_3b_instruct.yaml names it): 3,085,938,688 parameters, tied
QWEN25_3B = dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                 num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1_000_000.0,
                 rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645)
TINY = dict(QWEN25_3B, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
            vocab_size=512, bos_token_id=510, eos_token_id=511)
SIZES = {  # trajectories, prompt and response tokens; generation batch and new tokens
    "full": dict(trajs=32, prompt=512, response=512, gen_batch=64, gen_prompt=512, gen_new=128),
    "tiny": dict(trajs=4, prompt=16, response=16, gen_batch=2, gen_prompt=8, gen_new=4)}


def wall(fn, device, repeat: int = 1) -> float:
    """Best wall-clock seconds of `repeat` calls, the device's queue drained before and after each."""
    best = float("inf")
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best


def tokenizer_for(vocab: int, eos: int):
    """A word-level tokenizer over `vocab` placeholder tokens: the engine and learner need ids, eos and pad only."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token=f"t{eos}", pad_token=f"t{eos}")


def write_model(shape: dict, device, path: str) -> int:
    """A random Qwen2 of `shape` in bf16 (initialised on `device`: seconds, where 3B on a CPU takes a minute),
    saved with its tokenizer where the Learner loads a hub model from. Returns its parameter count."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(**shape)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(path)
    tokenizer_for(shape["vocab_size"], shape["eos_token_id"]).save_pretrained(path)
    del model
    return n


def baselines(device, shape: dict, tokens: int) -> dict:
    """The device's practical peaks, measured: one bf16 matmul of the MLP's shape, and a large device copy."""
    h, f = shape["hidden_size"], shape["intermediate_size"]
    a = torch.randn(tokens, h, device=device, dtype=torch.bfloat16)
    w = torch.randn(f, h, device=device, dtype=torch.bfloat16)
    torch.nn.functional.linear(a, w)
    t = wall(lambda: torch.nn.functional.linear(a, w), device, 5)
    src = torch.empty(1 << (28 if device.type == "cuda" else 22), dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    c = wall(lambda: dst.copy_(src), device, 5)
    return {"matmul_tokens": tokens, "matmul_s": t, "matmul_flops_per_s": 2 * tokens * h * f / t,
            "copy_bytes": 2 * src.numel(), "copy_s": c, "copy_bytes_per_s": 2 * 2 * src.numel() / c}


def learner_section(model_dir: str, device, n_params: int, size: dict, peak: dict) -> tuple[dict, dict, dict]:
    """Two steps (the first warms up), the second timed; returns the section and the bf16 weights around it."""
    from searchr1.config import AlgoConfig, ModelConfig, OptimConfig, TrainerConfig
    from searchr1.learner import Learner
    from searchr1.trajectory import Trajectory

    algo = AlgoConfig(kl_coef=0.001)  # production's (conf/experiment/search_r1.yaml): loads the reference model
    t0 = time.perf_counter()
    learner = Learner(ModelConfig(name="qwen2_5_3b_shape", source="hub", path=model_dir), algo, OptimConfig(),
                      TrainerConfig(), device)
    load_s = time.perf_counter() - t0
    g = torch.Generator().manual_seed(0)
    vocab = learner.vocab

    def batch():
        out = []
        for i in range(size["trajs"]):
            ids = torch.randint(0, vocab, (size["prompt"] + size["response"],), generator=g).tolist()
            out.append(Trajectory(qid=f"q{i // algo.group_size}", group=i // algo.group_size,
                                  prompt_ids=ids[:size["prompt"]], response_ids=ids[size["prompt"]:],
                                  loss_mask=[1] * size["response"], logprobs=[-11.9] * size["response"],
                                  reward=float(i % 2)))
        return out

    learner.step(batch())
    before = learner.bf16_weights()
    trajs = batch()
    step_s = wall(lambda: learner.step(trajs), device)
    export_s = wall(lambda: learner.bf16_weights(), device)
    after = learner.bf16_weights()
    tokens = size["trajs"] * (size["prompt"] + size["response"])
    # forward + backward of the policy (6 N per token) and the reference's forward (2 N per token)
    flops = 8 * n_params * tokens
    out = {"load_s": load_s, "step_s": step_s, "tokens": tokens, "trajectories": size["trajs"],
           "model_flops": flops, "model_flops_per_s": flops / step_s,
           "ratio_vs_matmul_peak": flops / step_s / peak["matmul_flops_per_s"],
           "bf16_export_s": export_s, "bf16_export_vs_copy": export_s / (2 * n_params / peak["copy_bytes_per_s"]),
           "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None}
    del learner
    return out, before, after


def codec_section(before: dict, after: dict, device, bucket_mb: int) -> dict:
    """Each format encoded and applied on the device (the torch path), bit-exact, against copy2."""
    from searchr1.weightsync import codec, stream

    o = [codec.bits(before[k]) for k in before]
    n = [codec.bits(after[k]) for k in before]
    total = sum(t.numel() for t in o)
    buf = [torch.empty_like(t) for t in o]

    def copy2():
        for b_, a_, c_ in zip(buf, o, n):
            b_.copy_(a_)
            b_.copy_(c_)

    copy2_s = wall(copy2, device, 3)
    del buf
    out = {"elements": total, "copy2_s": copy2_s, "formats": {}}
    cap = bucket_mb << 20
    for fmt in codec.FORMATS:
        window = codec.window_size(cap, fmt)
        pub = [t.clone() for t in o]
        scratch, writer = codec.Scratch(window, device, fmt), codec.FrameWriter(cap, device)
        frames = []

        def encode(keep: bool):
            stats = stream.StreamStats.empty(len(o))
            for last in stream.encode_stream(n, pub, range(len(o)), set(), writer, window, scratch, stats, "torch",
                                             fmt):
                if keep:
                    frames.append((writer.header(last, len(o)), writer.bucket[:writer.used].clone()))
                writer.reset()
            return stats

        def reset(ts):
            for p_, a_ in zip(ts, o):
                p_.copy_(a_)

        enc_s = float("inf")
        for _ in range(2):
            reset(pub)
            enc_s = min(enc_s, wall(lambda: encode(False), device))
        reset(pub)
        stats = encode(True)
        changed = sum(stats.count)
        tgt = [t.clone() for t in o]

        def apply():
            for h, b_ in frames:
                records, _, _, _ = codec.parse_header(h)
                codec.apply_frame(records, b_, tgt, "torch")

        apply_s = float("inf")
        for _ in range(2):
            reset(tgt)
            apply_s = min(apply_s, wall(apply, device))
        assert all(torch.equal(t, c) for t, c in zip(tgt, n)), f"{fmt}: apply on {device} is not bit-exact"
        payload = sum(h.numel() * 8 + b_.numel() for h, b_ in frames)
        out["formats"][fmt] = {"encode_s": enc_s, "apply_s": apply_s, "changed": changed,
                               "changed_frac": changed / total, "bytes": payload,
                               "bytes_per_changed": payload / max(changed, 1), "bit_exact": True,
                               "encode_vs_copy2": enc_s / copy2_s, "apply_vs_copy2": apply_s / copy2_s}
        del pub, tgt, frames, scratch, writer
    return out


def generation_section(model_dir: str, device, size: dict, peak: dict, n_params: int) -> dict:
    from transformers import AutoModelForCausalLM

    from searchr1.engines.base import Sampling
    from searchr1.engines.hf import HFEngine

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    shape = model.config
    engine = HFEngine(model, tokenizer_for(shape.vocab_size, shape.eos_token_id), device)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, shape.vocab_size - 2, (size["gen_prompt"],), generator=g).tolist()
               for _ in range(size["gen_batch"])]
    sampling = Sampling(temperature=1.0, max_new_tokens=size["gen_new"], seed=0)
    engine.generate(prompts[:2], Sampling(temperature=1.0, max_new_tokens=2, seed=0))
    gens = []
    gen_s = wall(lambda: gens.append(engine.generate(prompts, sampling)), device)
    new_tokens = sum(len(x.token_ids) for x in gens[-1])
    steps = max(len(x.token_ids) for x in gens[-1])
    weight_read_s = 2 * n_params / peak["copy_bytes_per_s"]  # one decode step reads every bf16 weight once
    return {"batch": size["gen_batch"], "prompt_tokens": size["gen_prompt"], "new_tokens": new_tokens,
            "decode_steps": steps, "generate_s": gen_s, "tokens_per_s": new_tokens / gen_s,
            "s_per_step": gen_s / steps, "weight_read_bound_s_per_step": weight_read_s,
            "ratio_vs_weight_read_bound": gen_s / steps / weight_read_s}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a tiny shape on the CPU: the suite's check of this code")
    ap.add_argument("--bucket-mb", type=int, default=64)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    if not a.tiny and not torch.cuda.is_available():
        raise SystemExit("bench/gpu.py: no CUDA device here; --tiny runs the same code on the CPU")
    device = torch.device("cpu" if a.tiny else "cuda")
    shape, size = (TINY, SIZES["tiny"]) if a.tiny else (QWEN25_3B, SIZES["full"])
    t_all = time.perf_counter()
    report = {"machine": {"platform": platform.platform(), "torch": torch.__version__, "device": str(device),
                          "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"},
              "shape": shape, "sizes": size}
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as d:
        t0 = time.perf_counter()
        n_params = write_model(shape, device, d)
        report["model"] = {"parameters": n_params, "write_s": time.perf_counter() - t0}
        report["baselines"] = peak = baselines(device, shape, size["trajs"] * (size["prompt"] + size["response"]))
        report["learner"], before, after = learner_section(d, device, n_params, size, peak)
        print(f"learner: {json.dumps(report['learner'])}", flush=True)
        report["codec"] = codec_section(before, after, device, a.bucket_mb)
        del before, after
        print(f"codec: {json.dumps(report['codec'])}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        report["generation"] = generation_section(d, device, size, peak, n_params)
        print(f"generation: {json.dumps(report['generation'])}", flush=True)
    report["total_s"] = time.perf_counter() - t_all
    out = Path(a.out or ROOT / "results" / "bench" / ("gpu_tiny.json" if a.tiny else "gpu.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
