"""searchr1: train a Search-R1 agent (LLM + local BM25 retrieval) with GRPO on Slurm."""
__version__ = "0.1.0"
