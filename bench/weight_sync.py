"""Delta versus full weight publication: each codec format's speed against a plain memory copy, its bytes, peer
codecs, the production shape, and gloo broadcast.

Two workloads, each a pair of bf16 snapshots (before, after one update):
 (a) real: one `searchr1.learner.Learner.step` (GRPO, AdamW at optim.lr) on SmolLM2-135M-Instruct,
     over on-policy trajectories built from HotpotQA questions (the prompt the agent uses, a gold-answer response,
     its log-probs recomputed by the model itself, random 0/1 rewards per group): a real optimizer step on a
     synthetic batch, not a rollout.
 (b) synthetic: Qwen2.5-3B-like shapes (the 151936x2048 embedding, MLP matrices, norms near 1.0) totalling
     >= 500M elements, fp32 masters ~N(0, 0.02) moved by an Adam-like step of lr 1e-6 per element.
Reported per workload (single-threaded, in one run so that ratios share the machine's state; times are this
thread's CPU time, best of `repeat`, because the machine is shared and wall clock includes other processes):
 copy2_s: copying both bf16 snapshots once (the memory-speed limit the goals refer to); per format (gap8, rice,
 rice_classes): encode_s (C++ kernel and the torch path used on CUDA), apply_s and verify_s (receiver), bytes per
 changed element, everything bit-exact (checked); the naive compare+nonzero+gather; where `zstandard` is
 installed, zstd-1 of the gap8 frames and the published codecs re-implemented in bench/sync_peers.py (PULSE:
 COO gaps uint8/uint16 + verbatim bf16 under zstd-1; slime: XOR + zstd-1; verl: int32 indices + bf16 values per
 shard), each timed with its compression and verified bit-exact; the step's entropy bound; then
 Publisher -> R Subscribers over gloo on loopback (R = 2, 4) for sync=full and sync=delta with each codec.
The production shape (Qwen2.5-3B, 14 receivers) is extrapolated from the synthetic step's changed fraction and
each format's bytes per changed element: bytes per step, and the time of one broadcast on 25 and 100 GB/s links.

    python bench/weight_sync.py            # full run (~1.5 GB per synthetic copy set; run alone, under nice)
    python bench/weight_sync.py --quick    # < 2 min: 20M synthetic elements, R = 2
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from searchr1.config import SyncConfig  # noqa: E402
from searchr1.weightsync import codec, stream  # noqa: E402

import sync_peers  # noqa: E402


def best_of(fn, repeat: int, setup=None) -> float:
    """Best CPU time of this thread over `repeat` runs (the codec and copies are single-threaded here)."""
    best = float("inf")
    for _ in range(repeat):
        if setup is not None:
            setup()
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best


# ---------------------------------------------------------------- workloads

def synthetic_shapes(total: int) -> dict[str, tuple[int, ...]]:
    """Qwen2.5-3B-like tensors: the embedding (scaled down in quick mode), 2048x11008 MLP matrices, norms."""
    hidden, inter = 2048, 11008
    vocab = min(151936, max(1, total // 2 // hidden))
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    left, i = total - vocab * hidden, 0
    while left > 0:
        rows = min(inter, -(-left // hidden))
        shapes[f"model.layers.{i // 2}.mlp.{'up' if i % 2 else 'gate'}_proj.weight"] = (rows, hidden)
        shapes[f"model.layers.{i // 2}.input_layernorm.weight"] = (hidden,)
        left -= rows * hidden + hidden
        i += 1
    return shapes


def synthetic_pair(shapes: dict, lr: float, steps: int, seed: int = 0, chunk: int = 1 << 24):
    """bf16 snapshots after Adam steps `steps-1` and `steps`: masters start from bf16 values (as a trainer
    loading a bf16 checkpoint does), gradients are i.i.d. N(0, 1), betas 0.9/0.999, eps 1e-8, no decay."""
    g = torch.Generator().manual_seed(seed)
    b1, b2 = 0.9, 0.999
    old, new = {}, {}
    for name, shape in shapes.items():
        numel = math.prod(shape)
        o = torch.empty(numel, dtype=torch.bfloat16)
        n = torch.empty(numel, dtype=torch.bfloat16)
        for lo in range(0, numel, chunk):
            k = min(chunk, numel - lo)
            w = torch.randn(k, generator=g)
            w = w.mul_(0.02) if len(shape) > 1 else w.mul_(0.05).add_(1.0)
            master = w.bfloat16().float()
            m, v = torch.zeros(k), torch.zeros(k)
            for t in range(1, steps + 1):
                grad = torch.randn(k, generator=g)
                m.mul_(b1).add_(grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
                denom = v.div(1 - b2 ** t).sqrt_().add_(1e-8)
                master.addcdiv_(m, denom, value=-lr / (1 - b1 ** t))
                if t == steps - 1:
                    o[lo:lo + k] = master.bfloat16()
            n[lo:lo + k] = master.bfloat16()
        old[name], new[name] = o.view(shape), n.view(shape)
    return old, new


def real_steps(steps: int):
    """bf16 weights before and after each of `steps` consecutive Learner.step calls on SmolLM2-135M-Instruct, each
    on its own questions, and the step times; every setting is the schemas' default (GRPO, AdamW at optim.lr)."""
    from searchr1 import metrics
    from searchr1.agent import build_prompt
    from searchr1.config import AlgoConfig, ModelConfig, OptimConfig, TrainerConfig
    from searchr1.data import load_file
    from searchr1.learner import Learner
    from searchr1.trajectory import Trajectory

    algo, optim = AlgoConfig(), OptimConfig()
    tr = Learner(ModelConfig(), algo, optim, TrainerConfig(), "cpu")
    per_step = 2  # questions per step (x group_size trajectories): a step fits beside the shared machine's other jobs
    qs = load_file(ROOT / "data/hotpotqa/dev_distractor/rpt_train300.jsonl")[: per_step * steps]
    g = torch.Generator().manual_seed(0)
    snaps, info = [tr.bf16_weights()], {
        "label": "consecutive searchr1.learner.Learner.step calls (GRPO, AdamW) on synthetic on-policy trajectories "
                 "of distinct questions", "lr": optim.lr, "steps": steps, "train_step_s": [], "loss": [],
        "grad_norm": []}
    for step in range(steps):
        trajs = []
        for qi, q in enumerate(qs[step * per_step: (step + 1) * per_step]):
            prompt = build_prompt(tr.tokenizer, q.question)
            resp = tr.tokenizer.encode(f"<answer> {q.answers[0]} </answer>", add_special_tokens=False)
            with torch.no_grad():
                ids = torch.tensor([prompt + resp])
                logp = torch.log_softmax(tr.model(input_ids=ids).logits[0, :-1].float(), -1)
                lp = logp[len(prompt) - 1:].gather(1, ids[0, len(prompt):, None])[:, 0].tolist()
            rewards = torch.randint(0, 2, (algo.group_size,), generator=g).tolist()
            rewards[0], rewards[1] = 0, 1  # a mixed group: non-zero advantages
            for r in rewards:
                trajs.append(Trajectory(qid=q.qid, group=qi, prompt_ids=prompt, response_ids=resp,
                                        loss_mask=[1] * len(resp), logprobs=lp, reward=float(r)))
        t0 = time.perf_counter()
        out = tr.step(trajs)
        info["train_step_s"].append(time.perf_counter() - t0)
        info["loss"].append(out[metrics.LOSS])
        info["grad_norm"].append(out[metrics.GRAD_NORM])
        snaps.append(tr.bf16_weights())
    info["trajectories_per_step"] = per_step * algo.group_size
    del tr
    return snaps, info


def density_over_k(snaps: list) -> dict:
    """Fraction of elements that differ between versions v and v + k, mean over v, for every k the steps allow:
    what a receiver k versions behind (the pipelined schedules' staging copy) must be sent."""
    out = {}
    total = sum(t.numel() for t in snaps[0].values())
    for k in range(1, len(snaps)):
        fr = [sum(int(torch.ne(codec.bits(snaps[v][n]), codec.bits(snaps[v + k][n])).sum()) for n in snaps[0]) / total
              for v in range(len(snaps) - k)]
        out[k] = sum(fr) / len(fr)
    return out


# ---------------------------------------------------------------- in-process codec

QWEN25_3B_PARAMS = 3_085_938_688  # Qwen2.5-3B-Instruct (tied embeddings): 6.17 GB in bf16
SEED_DELTA_BYTES = 165e6  # the seed's measured delta publication of that model, per step
RECEIVERS = 14  # production: 2 trainer + 14 rollout GPUs
LINKS_GBPS = (25, 100)


def format_timings(o, n, fmt: str, cap: int, repeat: int, torch_repeat: int, copy2: float) -> tuple[dict, list]:
    """One record format on the pair: encode (C++ and torch paths), frames, apply, verify, all bit-exact."""
    names = range(len(o))
    window = codec.window_size(cap, fmt)
    pub = [torch.empty_like(t) for t in o]
    scratch = codec.Scratch(window, torch.device("cpu"), fmt)
    writer = codec.FrameWriter(cap, torch.device("cpu"))
    frames = []

    def reset_pub():
        for p, a in zip(pub, o):
            p.copy_(a)

    def encode(impl: str, keep: bool):
        stats = stream.StreamStats.empty(len(o))
        for last in stream.encode_stream(n, pub, names, set(), writer, window, scratch, stats, impl, fmt):
            if keep:
                frames.append((writer.header(last, len(o)), writer.bucket[:writer.used].clone()))
            writer.reset()
        return stats

    impls = ["cpp", "torch"] if codec.kernel() is not None else ["torch"]
    out = {}
    for impl in impls:
        out[f"encode_{impl}_s"] = best_of(lambda: encode(impl, False), repeat if impl == "cpp" else torch_repeat,
                                          reset_pub)
    reset_pub()
    stats = encode(impls[0], True)
    assert all(torch.equal(p, c) for p, c in zip(pub, n))
    changed = sum(stats.count)
    payload = sum(h.numel() * 8 + b.numel() for h, b in frames)
    total = sum(t.numel() for t in o)
    kinds = {}
    for h, _ in frames:
        for rec in codec.parse_header(h)[0]:
            kinds[rec[1]] = kinds.get(rec[1], 0) + 1
    out.update(changed=changed, changed_frac=changed / total, bytes=payload, bytes_per_changed=payload / max(changed, 1),
               bytes_frac=payload / (2 * total), frames=len(frames),
               records={{codec.DELTA: "delta", codec.FULL: "full", codec.RICE: "rice"}[k]: v for k, v in kinds.items()})
    tgt = [torch.empty_like(t) for t in o]

    def reset_tgt():
        for t, a in zip(tgt, o):
            t.copy_(a)

    def apply(impl):
        for h, b in frames:
            records, _, _, _ = codec.parse_header(h)
            codec.apply_frame(records, b, tgt, impl)

    for impl in impls:
        out[f"apply_{impl}_s"] = best_of(lambda: apply(impl), repeat if impl == "cpp" else torch_repeat, reset_tgt)
        assert all(torch.equal(t, c) for t, c in zip(tgt, n)), f"{fmt} apply ({impl}) is not bit-exact"
    upd = stats.updated()
    k = impls[0]
    out[f"verify_{k}_s"] = best_of(lambda: [codec.digest(tgt[i], 0, k) for i in upd], repeat)
    out["bit_exact"] = True
    out["ratios"] = {"encode_vs_copy2": out[f"encode_{k}_s"] / copy2, "apply_vs_copy2": out[f"apply_{k}_s"] / copy2,
                     "encode_torch_vs_copy2": out["encode_torch_s"] / copy2,
                     "apply_torch_vs_copy2": out["apply_torch_s"] / copy2}
    return out, frames


def peer_timings(o, n, shapes, gap8_frames, copy2: float, changed: int, repeat: int) -> dict:
    """Peer formats, each with its compression, decoded and checked bit-exact. zstd level 1, one thread."""
    try:
        import zstandard
    except ImportError:
        return {"skipped": "zstandard is not installed (pip install zstandard, or the test extra)"}
    cctx, dctx = zstandard.ZstdCompressor(level=1), zstandard.ZstdDecompressor()
    out = {}

    def record(name, enc, dec):
        blobs = []
        out[name] = {"encode_s": best_of(lambda: blobs.append(enc()), repeat)}
        blob = blobs[-1]
        out[name]["bytes"] = sync_peers.nbytes(blob)
        out[name]["apply_s"] = best_of(lambda: dec(blob), repeat)
        out[name]["bytes_per_changed"] = out[name]["bytes"] / max(changed, 1)
        out[name]["ratios"] = {"encode_vs_copy2": out[name]["encode_s"] / copy2,
                               "apply_vs_copy2": out[name]["apply_s"] / copy2}

    # zstd-1 of this project's gap8 frames (compression only: their encoding is timed in formats.gap8)
    raw = [bytes(h.numpy().tobytes()) + bytes(b.numpy().tobytes()) for h, b in gap8_frames]
    record("zstd1_of_gap8_frames", lambda: [cctx.compress(r) for r in raw],
           lambda blob: [dctx.decompress(x) for x in blob])
    assert [dctx.decompress(x) for x in [cctx.compress(r) for r in raw]] == raw
    tgt = [torch.empty_like(t) for t in o]
    for name, (enc, dec) in sync_peers.CODECS.items():  # the published codecs (bench/sync_peers.py)
        record(name, lambda: enc(o, n, shapes, cctx), lambda blob: dec(blob, tgt, o, shapes, dctx))
        assert all(torch.equal(t, c) for t, c in zip(tgt, n)), f"{name} is not bit-exact"
    return out


def codec_timings(old: dict, new: dict, bucket_mb: int, repeat: int, torch_repeat: int) -> dict:
    names = list(old)
    o = [codec.bits(old[k]) for k in names]
    n = [codec.bits(new[k]) for k in names]
    total = sum(t.numel() for t in o)
    cap = bucket_mb << 20
    buf = [torch.empty_like(t) for t in o]

    def copy2():
        for b, a, c in zip(buf, o, n):
            b.copy_(a)
            b.copy_(c)

    def copy1():
        for b, c in zip(buf, n):
            b.copy_(c)

    out = {"elements": total, "tensors": len(names), "clock": "thread CPU time, best of repeat",
           "copy2_s": best_of(copy2, repeat), "copy1_s": best_of(copy1, repeat), "formats": {}}
    del buf
    frames = {}
    for fmt in codec.FORMATS:
        out["formats"][fmt], frames[fmt] = format_timings(o, n, fmt, cap, repeat, torch_repeat, out["copy2_s"])
        print(f"  {fmt}: {json.dumps(out['formats'][fmt]['ratios'])} "
              f"{out['formats'][fmt]['bytes_per_changed']:.3f} B/changed", flush=True)
    window = codec.window_size(cap)

    def naive():
        for a, c in zip(o, n):
            for start, m in codec.windows(a.numel(), window):
                idx = torch.ne(c[start:start + m], a[start:start + m]).nonzero()
                c[start:start + m][idx]
    out["encode_naive_s"] = best_of(naive, max(1, repeat // 2))
    changed = out["formats"]["gap8"]["changed"]
    out["changed"], out["changed_frac"] = changed, changed / total
    out["peers"] = peer_timings(o, n, [tuple(old[k].shape) for k in names], frames["gap8"], out["copy2_s"], changed,
                                max(1, repeat - 1))
    out["entropy_bound"] = sync_peers.entropy_bound(o, n)
    out["bytes_per_changed"] = {f: v["bytes_per_changed"] for f, v in out["formats"].items()}
    out["bytes_per_changed"].update({p: v["bytes_per_changed"] for p, v in out["peers"].items() if "bytes" in v})
    out["ratios"] = {f: v["ratios"] for f, v in out["formats"].items()}
    out["ratios"].update({p: v["ratios"] for p, v in out["peers"].items() if "ratios" in v})
    out["ratios"]["encode_naive_vs_copy2"] = out["encode_naive_s"] / out["copy2_s"]
    return out


def production(synthetic: dict) -> dict:
    """Qwen2.5-3B publishing to 14 receivers, at the synthetic step's changed fraction: bytes per step per
    format and one broadcast's time on each link speed. A pipelined broadcast (NCCL ring or tree) moves the
    data over every link once, so its time is about bytes / link bandwidth whatever the receiver count;
    `sequential_s` is the bound for 14 separate sends from the trainer."""
    frac = synthetic["changed_frac"]
    changed = QWEN25_3B_PARAMS * frac
    rows = {"full_export": 2.0 * QWEN25_3B_PARAMS, "seed_delta_quoted": SEED_DELTA_BYTES}
    rows.update({f: changed * b for f, b in synthetic["bytes_per_changed"].items()})
    out = {"model": "Qwen2.5-3B-Instruct", "parameters": QWEN25_3B_PARAMS, "receivers": RECEIVERS,
           "changed_frac": frac, "changed_elements": changed, "formats": {}}
    for name, nbytes in rows.items():
        out["formats"][name] = {"bytes_per_step": nbytes, **{
            f"broadcast_{g}GBps_s": nbytes / (g * 1e9) for g in LINKS_GBPS}, **{
            f"sequential_{g}GBps_s": RECEIVERS * nbytes / (g * 1e9) for g in LINKS_GBPS}}
    return out


# ---------------------------------------------------------------- gloo transport

def _transport_worker(rank, world, port, source, shapes, bucket_mb, q):
    from searchr1.weightsync.transport import Publisher, Subscriber

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    res = {}
    if rank == 0:
        old, new = torch.load(source)
    else:
        views = {k: torch.zeros(s, dtype=torch.bfloat16) for k, s in shapes.items()}
    for method, fmt in (("full", "gap8"), ("delta", "gap8"), ("delta", "rice"), ("delta", "rice_classes")):
        cfg = SyncConfig(method=method, bucket_mb=bucket_mb, verify=True, codec=fmt)
        ep = Publisher(dist.group.WORLD, cfg, "cpu") if rank == 0 else Subscriber(dist.group.WORLD, cfg, "cpu")
        key = method if method == "full" else f"delta_{fmt}"
        for step, snap in (("first", "old"), ("second", "new")):
            dist.barrier()
            t0 = time.perf_counter()
            m = ep.publish(old if snap == "old" else new, 0) if rank == 0 else ep.receive(views)
            m["wall_s"] = time.perf_counter() - t0
            res[f"{key}_{step}"] = m
        del ep
    dist.destroy_process_group()
    q.put((rank, res))


def transport_timings(source, shapes: dict, receivers: int, bucket_mb: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    q = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_transport_worker, args=(receivers + 1, port, source, shapes, bucket_mb, q), nprocs=receivers + 1)
    res = dict(q.get() for _ in range(receivers + 1))
    keep = ("sync/bytes", "sync/encode_s", "sync/transfer_s", "sync/apply_s", "sync/verify_s", "sync/changed_frac",
            "sync/bytes_frac", "sync/frames", "sync/full", "wall_s")
    out = {k: {f: v for f, v in m.items() if f in keep} for k, m in res[0].items()}
    out["ratios"] = {f"{k}_vs_full_{w}": out[f"{k}_second"][f] / out["full_second"][f]
                     for k in ("delta_gap8", "delta_rice", "delta_rice_classes")
                     for w, f in (("wall", "wall_s"), ("bytes", "sync/bytes"))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--synthetic-elements", type=int, default=0, help="default 500M (quick: 20M)")
    ap.add_argument("--lr", type=float, default=1e-6, help="synthetic Adam learning rate")
    ap.add_argument("--adam-steps", type=int, default=10, help="synthetic: publish the change of the last step")
    ap.add_argument("--bucket-mb", type=int, default=SyncConfig().bucket_mb)
    ap.add_argument("--repeat", type=int, default=0, help="timing repeats (best of); default 3 (quick: 2)")
    ap.add_argument("--torch-repeat", type=int, default=1, help="timing repeats of the (slow on CPU) torch path")
    ap.add_argument("--skip-real", action="store_true")
    ap.add_argument("--skip-gloo", action="store_true", help="no Publisher -> Subscribers runs (memory: R + 1 copies)")
    ap.add_argument("--real-steps", type=int, default=0,
                    help="consecutive real steps, for the density over k versions; default 4 (quick: 2)")
    ap.add_argument("--pair-cache", default="", help="a folder keeping the generated pairs across runs")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    torch.set_num_threads(1)  # the kernel is single-threaded: compare against a single-threaded copy
    total = a.synthetic_elements or (20_000_000 if a.quick else 500_000_000)
    repeat = a.repeat or (2 if a.quick else 3)
    a.real_steps = a.real_steps or (2 if a.quick else 4)
    receivers = [] if a.skip_gloo else [2] if a.quick else [2, 4]
    out_path = Path(a.out or ROOT / "results/bench" / ("weight_sync_quick.json" if a.quick else "weight_sync.json"))
    t_kernel = time.perf_counter()
    kernel_ok = codec.kernel() is not None
    report = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
                          "threads": 1, "cpp_kernel": kernel_ok,
                          "kernel_load_s": time.perf_counter() - t_kernel},
              "args": vars(a), "workloads": {}}
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(a.pair_cache) if a.pair_cache else None
        if not a.skip_real:
            hit = cache / f"real_{'quick' if a.quick else 'full'}_{a.real_steps}.pt" if cache else None
            if hit is not None and hit.exists():
                snaps, info = torch.load(hit)
            else:
                snaps, info = real_steps(a.real_steps)
                if hit is not None:
                    cache.mkdir(parents=True, exist_ok=True)
                    torch.save((snaps, info), hit)
            info["changed_frac_over_k_versions"] = density_over_k(snaps)
            print(f"real steps: {json.dumps(info['changed_frac_over_k_versions'])}", flush=True)
            old, new = snaps[0], snaps[1]
            shapes = {k: tuple(v.shape) for k, v in old.items()}
            src = os.path.join(tmp, "real.pt")
            torch.save((old, new), src)
            w = {"info": info, "codec": codec_timings(old, new, a.bucket_mb, repeat, a.torch_repeat)}
            if len(snaps) > 2:  # the change over every step at once: what a receiver that many versions behind gets
                report["workloads"][f"real_smollm2_135m_over_{len(snaps) - 1}_steps"] = {
                    "info": {"label": f"version 0 to version {len(snaps) - 1} of the same steps"},
                    "codec": codec_timings(snaps[0], snaps[-1], a.bucket_mb, repeat, a.torch_repeat)}
            del old, new, snaps
            w["gloo"] = {f"receivers_{r}": transport_timings(src, shapes, r, a.bucket_mb) for r in receivers}
            report["workloads"]["real_smollm2_135m"] = w
        shapes = synthetic_shapes(total)
        hit = cache / f"synthetic_{total}_{a.lr}_{a.adam_steps}.pt" if cache else None
        torch.set_num_threads(os.cpu_count() or 1)
        t0 = time.perf_counter()
        if hit is not None and hit.exists():
            old, new = torch.load(hit)
        else:
            old, new = synthetic_pair(shapes, a.lr, a.adam_steps)
            if hit is not None:
                cache.mkdir(parents=True, exist_ok=True)
                torch.save((old, new), hit)
        gen_s = time.perf_counter() - t0
        torch.set_num_threads(1)
        print(f"synthetic pair: {total} elements", flush=True)
        src = os.path.join(tmp, "synthetic.pt")
        torch.save((old, new), src)
        w = {"info": {"label": f"synthetic: Adam step {a.adam_steps} vs {a.adam_steps - 1} on i.i.d. gradients",
                      "lr": a.lr, "elements": sum(t.numel() for t in old.values()), "tensors": len(old),
                      "shapes": {k: list(v) for k, v in shapes.items()}, "generate_s": gen_s},
             "codec": codec_timings(old, new, a.bucket_mb, repeat, a.torch_repeat)}
        del old, new
        w["gloo"] = {f"receivers_{r}": transport_timings(src, shapes, r, a.bucket_mb) for r in receivers}
        report["workloads"]["synthetic"] = w
        report["production"] = production(w["codec"])
        print(json.dumps({k: v["bytes_per_step"] for k, v in report["production"]["formats"].items()}), flush=True)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=1))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
