import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# Modules whose tests build vLLM engines (in this process or in their runs' rollout ranks). Two vLLM-CPU engines
# at once on 2 cores each bind their OpenMP threads to every core and spin against each other (a run beside
# another took 20+ minutes), so under `make test`'s workers these modules share one worker, one at a time.
VLLM_MODULES = {"test_engines", "test_transport", "test_golden"}
# Modules that submit real jobs to the local Slurm cluster: their tests preempt, block and fill its nodes (an
# urgent job preempts whatever debug job holds a node), so a job of the other module beside them was preempted
# mid-test (CI on a fresh machine, 2026-12-04). One worker, one at a time.
SLURM_MODULES = {"test_slurm_cluster", "test_slurm_elastic"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    import torch

    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
        # --dist loadgroup: a module's tests stay on one worker, so its module fixtures run once
        module = item.module.__name__.rsplit(".", 1)[-1]
        group = "vllm" if module in VLLM_MODULES else "slurm" if module in SLURM_MODULES else module
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """The smoke run (tests/test_loop.py's launch: 2 trainer + 2 rollout ranks, 3 steps) that several modules
    read: one launch for all of them. It evaluates 2wiki's held-out questions beside HotpotQA's, so the
    datasets' end-to-end checks read the same run."""
    from tests.test_loop import launch

    r, run = launch(tmp_path_factory.mktemp("runs"), "data.eval_sets=[hotpotqa,2wiki]")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r, run


def pytest_sessionfinish(session, exitstatus):
    session.config._searchr1_exitstatus = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Leave with pytest's status once everything is reported. vLLM engines built inside this process tear down
    at interpreter exit by destroying a process group that is gone, and their threads then abort the interpreter
    (SIGABRT, exit 134) after every test has passed."""
    status = getattr(config, "_searchr1_exitstatus", None)
    if status is not None and not hasattr(config, "workerinput"):  # a worker's exit is pytest-xdist's to make
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
