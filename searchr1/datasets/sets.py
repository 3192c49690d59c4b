"""The evaluation sets, each a `Dataset` (searchr1/datasets/__init__.py); searchr1.registry.DATASETS names them.
data/<set>/README.md says where each file comes from, its licence and checksum."""
from __future__ import annotations

from searchr1.data import load_file
from searchr1.datasets import Dataset
from searchr1.datasets.readers import read_2wiki, read_musique, read_nq
from searchr1.datasets.scoring import EM, HOTPOT_F1, squad1_f1, squad2_f1

HOTPOTQA = Dataset("hotpotqa", "HotpotQA", "data/hotpotqa/dev_distractor/rpt_test500.jsonl",
                   "data/hotpotqa/heldout200.ids", load_file, EM, HOTPOT_F1, licence="CC BY-SA 4.0")
TWOWIKI = Dataset("2wiki", "2WikiMultihopQA", "data/2wiki/dev_context164.jsonl", "data/2wiki/heldout.ids",
                  read_2wiki, EM, HOTPOT_F1, licence="Apache-2.0")
MUSIQUE = Dataset("musique", "MuSiQue-Ans", "data/musique/dev_heldout200.jsonl", "data/musique/heldout.ids",
                  read_musique, EM, squad2_f1, licence="CC BY 4.0")
NQ = Dataset("nq", "NQ-open", "data/nq/nq-open-oracle.jsonl.gz", "data/nq/heldout.ids", read_nq, EM, squad1_f1,
             corpus_from="file", licence="CC BY-SA 3.0")
