"""The typed keys of the data group (`data.*`), part of searchr1/config.py's schema: the training files and
mix, the held-out sample, the corpus scope, the dev split for tuning, the evaluation sets. Only the checks and
the registry are imported here, so the schema stays light."""
from __future__ import annotations

from dataclasses import dataclass, field

from searchr1 import registry
from searchr1.checks import _check, _one_of, _positive


@dataclass
class DataConfig:
    # Paths are relative to the repository root unless absolute.
    train_files: list[str] = field(default_factory=lambda: [
        "data/hotpotqa/dev_distractor/rpt_train300.jsonl",
        "data/hotpotqa/train/hipporag_train100.json",
        "data/hotpotqa/train/amor_train_hard100.json",
    ])
    eval_file: str = "data/hotpotqa/dev_distractor/rpt_test500.jsonl"
    # The held-out ids, one per line; written by `python -m searchr1.data split` with a seeded rule.
    eval_ids_file: str = "data/hotpotqa/heldout200.ids"
    eval_size: int = 200
    train_size: int = 0  # 0: the whole training pool
    # train: passages of the training questions only; train+eval: also the held-out questions' contexts
    # (as in the seed, so that every held-out question is answerable from the index).
    corpus_scope: str = "train+eval"
    # Tuning without touching the held-out questions: dev_size training questions (a seeded draw) are kept out
    # of training, and eval_on=dev evaluates on them instead of the held-out set.
    dev_size: int = 0
    eval_on: str = "heldout"  # heldout | dev
    # Held-out sets evaluated at every evaluation point (registry.DATASETS); each its own corpus, metrics line and
    # prediction files (searchr1/datasets). hotpotqa, the training set's own, is always evaluated.
    eval_sets: list[str] = field(default_factory=lambda: ["hotpotqa"])
    # Training sets beside HotpotQA and their share of every step's questions, e.g. {nq: 0.5} (Search-R1's NQ +
    # HotpotQA): each set's questions outside its held-out sample join the pool, their passages the index
    train_mix: dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        _check(len(self.train_files) > 0, "data.train_files", self.train_files, "needs at least one file")
        _positive(self, "data", "eval_size")
        _positive(self, "data", "train_size", strict=False)
        _one_of("data.corpus_scope", self.corpus_scope, {"train", "train+eval"})
        _one_of("data.eval_on", self.eval_on, {"heldout", "dev"})
        _positive(self, "data", "dev_size", strict=False)
        _check(self.eval_on == "heldout" or self.dev_size > 0, "data.eval_on", self.eval_on,
               "needs data.dev_size > 0 (the dev questions are taken from the training pool)")
        for name in self.eval_sets:
            _one_of("data.eval_sets", name, registry.DATASETS)
        _check(self.eval_sets[:1] == ["hotpotqa"] and len(set(self.eval_sets)) == len(self.eval_sets),
               "data.eval_sets", self.eval_sets, "must start with hotpotqa and name each set once")
        for name, share in self.train_mix.items():
            _one_of("data.train_mix", name, set(registry.DATASETS) - {"hotpotqa"})
            _check(0 < share < 1, f"data.train_mix.{name}", share, "must be in (0, 1)")
        _check(sum(self.train_mix.values()) < 1, "data.train_mix", dict(self.train_mix),
               "shares must leave HotpotQA a part (they sum to less than 1)")
        _check(self.eval_on == "heldout" or self.eval_sets == ["hotpotqa"], "data.eval_sets", self.eval_sets,
               "other sets' held-out questions stay untouched while tuning (data.eval_on=dev)")
