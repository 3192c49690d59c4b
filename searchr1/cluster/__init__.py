"""Cluster backends: local processes and one heterogeneous Slurm job. They know nothing of the algorithm."""
