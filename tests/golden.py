"""The golden runs: a run's signature (rewards, losses, predictions, final weight digests) and the recorded one.

A refactor or a new schedule must give the same signature for the same seed and config. Float results depend
on the CPU's instruction set (a bf16 product on avx512_bf16 is not the one on AVX2 or on AMX), so each machine
kind has its own signature, `golden/NAME/KIND.json`, recorded from the same code on that kind; a run is compared
with its own kind's, and the in-suite A/B tests (test_golden.py) hold everywhere. A change that must keep
behaviour keeps every recorded kind; one that changes floats on purpose records each kind it can run on again.

    python tests/golden.py check smoke        # run the smoke golden and compare (also in make test)
    python tests/golden.py check cpu          # the short search_r1_cpu golden (vLLM, SmolLM2; ~10 min)
    python tests/golden.py record NAME RUN    # write tests/golden/NAME/KIND.json (this machine's) from a run folder
"""
from __future__ import annotations

import hashlib
import json
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
    "smoke": ["+experiment=smoke"],
    "cpu": ["+experiment=search_r1_cpu", "steps=4", "checkpoint_every=4", "eval_every=0", "data.eval_size=24",
            "algo.entropy_coef=0.01", "trainer.micro_batch_tokens=2048",
            # the experiment as it was when this golden was recorded (c3f4b79; it has been tuned since)
            "warm_start.steps=0", "optim.lr=1e-5", "trainer.train_top_layers=0", "eval_before=true",
            "agent.prompt=search_r1_example", "agent.max_new_tokens=96", "agent.max_context_tokens=1536",
            "reward.format_score=0.1", "retriever.top_k=3", "algo.group_size=5", "algo.questions_per_step=8",
            "sampling.temperature=1.0", "curriculum.warm_start=all", "curriculum.rl=all", "engine.vllm.block_size=0"],
}


def fingerprint() -> dict:
    import torch

    flags = set()
    try:
        line = next(x for x in open("/proc/cpuinfo") if x.startswith("flags"))
        flags = set(line.split(":", 1)[1].split())
    except (OSError, StopIteration):
        pass
    return {"machine": platform.machine(), "torch": torch.__version__,
            "isa": sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})}


def kind(fp: dict) -> str:
    """A recorded signature's file name: the architecture and instruction set (the torch build is checked
    inside)."""
    return "-".join([fp["machine"], *fp["isa"]])


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
    h = hashlib.sha256()
    for f in sorted((run / "checkpoints" / latest / "model").glob("*.safetensors")):
        sd = load_file(str(f))
        for k in sorted(sd):
            h.update(k.encode())
            h.update(sd[k].contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return {"steps": steps, "predictions": preds, "weights": h.hexdigest()}


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


def run(name: str, run_root: Path, *extra: str) -> Path:
    name_arg = f"run_name=golden-{name}"
    r = subprocess.run([sys.executable, "launch.py", *RUNS[name], f"run_root={run_root}", name_arg, *extra],
                       cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"golden run {name} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return sorted(p for p in Path(run_root).iterdir() if p.name.startswith(f"golden-{name}"))[-1]


def recorded(name: str) -> dict | None:
    """The signature of golden run `name` recorded on this machine's kind and torch build, or None."""
    fp = fingerprint()
    path = GOLDEN / name / f"{kind(fp)}.json"
    want = json.loads(path.read_text()) if path.exists() else None
    return want if want is not None and want["fingerprint"] == fp else None


def unrecorded(name: str) -> str:
    """Why this machine has no signature of `name` to compare with."""
    kinds = [json.loads(p.read_text())["fingerprint"] for p in sorted((GOLDEN / name).glob("*.json"))]
    return (f"golden run {name!r} has no signature for this machine kind ({fingerprint()}); recorded: {kinds} "
            f"(float results differ between instruction sets; `python tests/golden.py record {name} RUN`)")


if __name__ == "__main__":
    import tempfile

    if len(sys.argv) >= 3 and sys.argv[1] == "record":
        folder, out = Path(sys.argv[3]), GOLDEN / sys.argv[2] / f"{kind(fingerprint())}.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(
            {"fingerprint": fingerprint(), "overrides": RUNS[sys.argv[2]], **signature(folder)}, indent=1) + "\n")
    elif len(sys.argv) == 3 and sys.argv[1] == "check":
        want = recorded(sys.argv[2])
        if want is None:
            sys.exit(unrecorded(sys.argv[2]))
        with tempfile.TemporaryDirectory() as tmp:
            got = signature(run(sys.argv[2], Path(tmp)))
        diff = differences(want, got)
        print("IDENTICAL to the recorded golden run" if not diff else "\n".join(diff))
        sys.exit(1 if diff else 0)
    else:
        sys.exit(__doc__)
