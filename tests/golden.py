"""The golden runs: a run's signature (rewards, losses, predictions, final weights) and the recorded one.

A refactor or a new schedule must give the same signature for the same seed and config.

`portable` guards every CPU: the smoke run in fp32 (trainer and engine), with the math libraries held to one code
path whatever the instruction set (PORTABLE_ENV: ATen's scalar kernels, MKL's conditional numerical
reproducibility, oneDNN at SSE4.1), recorded once in `golden/portable.json` and compared on any machine, so a
clean clone on a CPU kind nobody recorded is still guarded. Everything discrete is compared exactly (rewards,
answers, searches, tokens, the prediction files); floats within stated tolerances (PORTABLE_TOL), which are ten
times what this machine's AVX2 kernels and the portable ones differ by on the same run (the loss 7e-8 relative,
one bf16 element of 179k changed in a step) and a tenth of what a learning rate off by a thousandth moves
(grad_norm 3e-6 relative, sync/changed by 136-207 elements a step). Held to one code path, the recording still
differs on an AMX Xeon in the last bits of the fp32 master weights: each tensor's sum by up to 1.5e-10 of its L1
norm (the tied embedding's by 1.8e-6 in 63.4, past an absolute bound of 1e-7 that CI once held it to), so a
tensor's sum is held to ten times that relative to its L1 norm; lr x 1.001 exceeds it in 14 of 20 tensors.

Float results in bf16 depend on the CPU's instruction set (a bf16 product on avx512_bf16 is not the one on AVX2
or on AMX), so the bf16 goldens are per machine kind, `golden/NAME/KIND.json` (KIND: searchr1.placement.cpu_kind()),
recorded from the same code on that kind, and compared, exactly, where this machine's kind has one.

    python tests/golden.py check portable     # the portable golden (in make test, on every machine)
    python tests/golden.py check smoke        # the smoke golden of this machine kind (in make test where recorded)
    python tests/golden.py check cpu          # the short search_r1_cpu golden (vLLM, SmolLM2; ~10 min)
    python tests/golden.py record NAME RUN    # write tests/golden/NAME/KIND.json (this machine's) from a run folder
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
KEYS = ["rollout/reward", "rollout/em", "rollout/f1", "rollout/answer_rate", "rollout/searches", "rollout/turns",
        "rollout/generated_tokens_total", "rollout/trajectories_total", "train/loss", "train/grad_norm",
        "train/entropy", "train/approx_kl", "train/clip_frac", "train/tokens_trained", "sync/changed", "sync/bytes"]
EVAL_KEYS = ["eval/em_count", "eval/f1", "eval/n", "eval/searches", "eval/answer_rate"]
RUNS = {
    "portable": ["+experiment=smoke", "trainer.compute_dtype=fp32", "engine.compute_dtype=fp32"],
    "smoke": ["+experiment=smoke"],
    "cpu": ["+experiment=search_r1_cpu", "steps=4", "checkpoint_every=4", "eval_every=0", "data.eval_size=24",
            "algo.entropy_coef=0.01", "trainer.micro_batch_tokens=2048",
            # the experiment as it was when this golden was recorded (c3f4b79; it has been tuned since)
            "warm_start.steps=0", "optim.lr=1e-5", "trainer.train_top_layers=0", "eval_before=true",
            "agent.prompt=search_r1_example", "agent.max_new_tokens=96", "agent.max_context_tokens=1536",
            "reward.format_score=0.1", "retriever.top_k=3", "algo.group_size=5", "algo.questions_per_step=8",
            "sampling.temperature=1.0", "curriculum.warm_start=all", "curriculum.rl=all", "engine.vllm.block_size=0"],
}


PORTABLE_ENV = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"}
FLOAT_KEYS = {"train/loss", "train/grad_norm", "train/entropy", "train/approx_kl", "train/clip_frac"}
# weight_sums: a tensor's |sum - recorded sum|, as a share of its L1 norm (sum of |w|) in this run
PORTABLE_TOL = {"rel": 1e-6, "abs": 1e-12, "sync/changed": 16, "sync/bytes": 64, "weight_sums": 1.5e-9}


def fingerprint() -> dict:
    import torch

    from searchr1.placement import isa

    return {"machine": platform.machine(), "torch": torch.__version__, "isa": isa()}


def signature(run: Path) -> dict:
    import torch
    from safetensors.torch import load_file

    run = Path(run)
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = {f"train{r['step']}": {k: r.get(k) for k in KEYS} for r in recs if r["kind"] == "train"}
    steps.update({f"eval{r['step']}": {k: r.get(k) for k in EVAL_KEYS} for r in recs if r["kind"] == "eval"})
    preds = {}
    for p in sorted((run / "predictions").glob("*.jsonl")):
        lines = [json.loads(x) for x in p.read_text(encoding="utf-8").splitlines() if x.strip()]
        preds[p.name] = hashlib.sha256(json.dumps(lines, sort_keys=True).encode()).hexdigest()
    latest = (run / "checkpoints" / "latest").read_text().strip()
    h, sums, abs_sums = hashlib.sha256(), {}, {}
    for f in sorted((run / "checkpoints" / latest / "model").glob("*.safetensors")):
        sd = load_file(str(f))
        for k in sorted(sd):
            h.update(k.encode())
            h.update(sd[k].contiguous().view(-1).view(torch.uint8).numpy().tobytes())
            w = sd[k].double()
            sums[k], abs_sums[k] = w.sum().item(), w.abs().sum().item()
    return {"steps": steps, "predictions": preds, "weights": h.hexdigest(), "weight_sums": sums,
            "weight_abs_sums": abs_sums}


def portable_differences(want: dict, got: dict) -> list[str]:
    """`got` against the portable recording: discrete values exactly, floats within PORTABLE_TOL."""
    t, out = PORTABLE_TOL, []
    for key in sorted(set(want["steps"]) | set(got["steps"])):
        x, y = want["steps"].get(key), got["steps"].get(key)
        if not x or not y:
            out.append(f"{key}: {x} != {y}")
            continue
        for k in sorted(set(x) | set(y)):
            a, b = x.get(k), y.get(k)
            if k in FLOAT_KEYS and a is not None and b is not None:
                bad = abs(a - b) > t["abs"] + t["rel"] * abs(a)
            elif k in ("sync/changed", "sync/bytes") and a is not None and b is not None:
                bad = abs(a - b) > t[k]
            else:
                bad = a != b
            if bad:
                out.append(f"{key}: {k} {a!r} != {b!r}")
    if want["predictions"] != got["predictions"]:
        out.append(f"predictions differ: {sorted(k for k in want['predictions'] if want['predictions'][k] != got['predictions'].get(k))}")
    ws, gs, l1 = want["weight_sums"], got["weight_sums"], got["weight_abs_sums"]
    far = sorted(k for k in set(ws) | set(gs)
                 if k not in ws or k not in gs or abs(ws[k] - gs[k]) > t["weight_sums"] * l1[k])
    if far:
        out.append(f"final weights differ beyond {t['weight_sums']} of a tensor's L1 norm (sum per tensor) in "
                   f"{len(far)} tensors, e.g. {far[:3]}")
    return out


def differences(a: dict, b: dict) -> list[str]:
    out = []
    for key in sorted(set(a["steps"]) | set(b["steps"])):
        x, y = a["steps"].get(key), b["steps"].get(key)
        if x != y:
            out.append(f"{key}: " + (", ".join(f"{k} {x.get(k)!r} != {y.get(k)!r}" for k in x if x.get(k) != y.get(k))
                                     if x and y else f"{x} != {y}"))
    if a["predictions"] != b["predictions"]:
        out.append(f"predictions differ: {sorted(k for k in a['predictions'] if a['predictions'][k] != b['predictions'].get(k))}")
    if a["weights"] != b["weights"]:
        out.append(f"final weights differ: {a['weights'][:16]} != {b['weights'][:16]}")
    return out


def golden_path(name: str) -> Path:
    from searchr1.placement import cpu_kind

    return GOLDEN / "portable.json" if name == "portable" else GOLDEN / name / f"{cpu_kind()}.json"


def run(name: str, run_root: Path, *extra: str) -> Path:
    name_arg = f"run_name=golden-{name}"
    env = dict(os.environ, **PORTABLE_ENV) if name == "portable" else None
    r = subprocess.run([sys.executable, "launch.py", *RUNS[name], f"run_root={run_root}", name_arg, *extra],
                       cwd=ROOT, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"golden run {name} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return sorted(p for p in Path(run_root).iterdir() if p.name.startswith(f"golden-{name}"))[-1]


def recorded(name: str) -> dict | None:
    """The signature of golden run `name` recorded on this machine's kind and torch build (any kind for
    `portable`), or None."""
    fp, path = fingerprint(), golden_path(name)
    want = json.loads(path.read_text()) if path.exists() else None
    if name == "portable":
        return want
    return want if want is not None and want["fingerprint"] == fp else None


def unrecorded(name: str) -> str:
    """Why this machine has no signature of `name` to compare with."""
    kinds = [json.loads(p.read_text())["fingerprint"] for p in sorted((GOLDEN / name).glob("*.json"))]
    return (f"golden run {name!r} has no signature for this machine kind ({fingerprint()}); recorded: {kinds} "
            f"(float results differ between instruction sets; `python tests/golden.py record {name} RUN`)")


if __name__ == "__main__":
    import tempfile

    if len(sys.argv) >= 3 and sys.argv[1] == "record":
        folder, out = Path(sys.argv[3]), golden_path(sys.argv[2])
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(
            {"fingerprint": fingerprint(), "overrides": RUNS[sys.argv[2]], **signature(folder)}, indent=1) + "\n")
    elif len(sys.argv) == 3 and sys.argv[1] == "check":
        want = recorded(sys.argv[2])
        if want is None:
            sys.exit(unrecorded(sys.argv[2]))
        with tempfile.TemporaryDirectory() as tmp:
            got = signature(run(sys.argv[2], Path(tmp)))
        diff = (portable_differences if sys.argv[2] == "portable" else differences)(want, got)
        print("IDENTICAL to the recorded golden run" if not diff else "\n".join(diff))
        sys.exit(1 if diff else 0)
    else:
        sys.exit(__doc__)
