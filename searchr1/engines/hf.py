"""The transformers engine: our own sampling loop over the model's KV cache (no vLLM needed).

A hand-written loop rather than `generate()`: it gives, per sampled token, the log-prob under the distribution
it was sampled from (log-softmax of logits / T, before top-p: the temperature contract of engines/base.py),
per-row seeds, and stop strings checked on the decoded text of each row while the token that completed the
stop string is kept.

Rows are left-padded into one batch; finished rows ride along until every row is done (their extra tokens
are dropped), which keeps the cache a plain rectangle.
"""
from __future__ import annotations

import torch

from searchr1.engines.base import Bf16Mirror, Generation, Sampling, check_prompts


def _eos_ids(model, tokenizer) -> set[int]:
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, (list, tuple)) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("the model has no EOS token id (generation_config.eos_token_id and tokenizer.eos_token_id)")
    return ids


def _sample_b(logits_bv: torch.Tensor, sampling: Sampling, generators: list[torch.Generator] | None) -> torch.Tensor:
    if sampling.temperature == 0:
        return logits_bv.argmax(-1)
    probs_bv = torch.softmax(logits_bv / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_bv, order_bv = probs_bv.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always survives).
        drop_bv = sorted_bv.cumsum(-1) - sorted_bv > sampling.top_p
        sorted_bv = sorted_bv.masked_fill(drop_bv, 0.0)
        probs_bv = torch.zeros_like(probs_bv).scatter_(-1, order_bv, sorted_bv)
    if generators is None:
        return torch.multinomial(probs_bv, 1).squeeze(-1)
    return torch.cat([torch.multinomial(probs_bv[i], 1, generator=g) for i, g in enumerate(generators)])


def build(model_cfg, engine_cfg, max_model_len: int, device="cpu", temperature: float = 1.0) -> "HFEngine":
    """The `engine.name=hf` factory: the policy in bf16, computing in `engine.compute_dtype`."""
    import logging

    from searchr1 import models, placement

    device = torch.device(device)
    dtype, why = placement.compute_dtype(engine_cfg.compute_dtype, device)
    logging.getLogger(__name__).info("hf engine computes in %s (%s)", dtype, why)
    model, tokenizer = models.load_model(model_cfg, dtype=torch.bfloat16)
    # .float() only where asked: .to(bfloat16) would also cast fp32 buffers (rotary inv_freq) and move the
    # numbers the engine computes
    return HFEngine(model.float() if dtype == torch.float32 else model, tokenizer, device)


class HFEngine:
    def __init__(self, model, tokenizer, device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        # fp32 compute keeps bf16 masters for weight sync (exact: the fp32 weights are bf16 values)
        self.compute_dtype = next(self.model.parameters()).dtype
        fp32 = self.compute_dtype == torch.float32
        self.mirror = Bf16Mirror(dict(self.model.named_parameters())) if fp32 else None
        self.tokenizer = tokenizer
        self.eos_ids = _eos_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.vocab_size = model.get_input_embeddings().weight.shape[0]
        self._pieces: dict[int, str] = {}

    def _piece(self, tok: int) -> str:
        piece = self._pieces.get(tok)
        if piece is None:
            piece = self._pieces[tok] = self.tokenizer.decode([tok])
        return piece

    def weight_views(self) -> dict[str, torch.Tensor]:
        # named_parameters lists a tied weight once, under its first name (the input embedding).
        if self.mirror is not None:
            return self.mirror.views()
        views = {name: p.data for name, p in self.model.named_parameters()}
        bad = {n: v.dtype for n, v in views.items() if v.dtype != torch.bfloat16}
        if bad:
            raise TypeError(f"weight_views needs a bf16 model; these are not: {dict(list(bad.items())[:3])}")
        return views

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[Generation]:
        if not prompts:
            return []
        check_prompts(prompts, self.vocab_size)
        if self.mirror is not None:
            self.mirror.refresh()
        n, width = len(prompts), max(len(p) for p in prompts)
        ids_bt = torch.full((n, width), self.pad_id, dtype=torch.long)
        mask_bt = torch.zeros((n, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids_bt[i, width - len(p):] = torch.tensor(p)
            mask_bt[i, width - len(p):] = 1
        ids_bt, mask_bt = ids_bt.to(self.device), mask_bt.to(self.device)
        pos_b = mask_bt.sum(-1) - 1
        generators = None
        if sampling.seed is not None and sampling.temperature > 0:
            generators = [torch.Generator(self.device).manual_seed(sampling.seed + i) for i in range(n)]

        from transformers import DynamicCache

        cache = DynamicCache()
        out = self.model(input_ids=ids_bt, attention_mask=mask_bt, position_ids=(mask_bt.cumsum(-1) - 1).clamp(min=0),
                         past_key_values=cache, use_cache=True, logits_to_keep=1)
        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        texts = [""] * n
        reasons: list[str | None] = [None] * n
        longest_stop = max((len(s) for s in sampling.stop), default=0)
        for _ in range(sampling.max_new_tokens):
            logits_bv = out.logits[:, -1].float()
            tok_b = _sample_b(logits_bv, sampling, generators)
            tempered_bv = logits_bv / sampling.temperature if sampling.temperature not in (0.0, 1.0) else logits_bv
            lp_b = torch.log_softmax(tempered_bv, dim=-1).gather(-1, tok_b[:, None]).squeeze(-1)
            for i, (tok, lp) in enumerate(zip(tok_b.tolist(), lp_b.tolist())):
                if reasons[i] is not None:
                    continue
                tokens[i].append(tok)
                logprobs[i].append(lp)
                if tok in self.eos_ids:
                    reasons[i] = "eos"
                    continue
                if longest_stop:
                    piece = self._piece(tok)
                    tail = texts[i][-(longest_stop - 1):] + piece if longest_stop > 1 else piece
                    texts[i] += piece
                    if any(s in tail for s in sampling.stop):
                        reasons[i] = "stop"
                        continue
                if len(tokens[i]) == sampling.max_new_tokens:
                    reasons[i] = "length"
            if all(r is not None for r in reasons):
                break
            mask_bt = torch.cat([mask_bt, mask_bt.new_ones((n, 1))], dim=-1)
            pos_b = pos_b + 1
            out = self.model(input_ids=tok_b[:, None], attention_mask=mask_bt, position_ids=pos_b[:, None],
                             past_key_values=cache, use_cache=True)
        return [Generation(t, lp, r) for t, lp, r in zip(tokens, logprobs, reasons)]
