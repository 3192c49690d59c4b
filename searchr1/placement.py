"""Where each local rank computes, and in which precision: CPU cores per rank, and the compute dtype.

Cores: two roles on one small machine. In the synchronous schedule they take turns (rollouts generate while the
trainers wait, then the other way round), so `alternate` gives each role every core, one disjoint share per rank
of that role; the overlapping schedules need `split`, which gives trainers and rollouts cores of their own, as
separate GPUs would. A rank's threads (OMP, the retriever's) never exceed its cores: oversubscribed cores made a
busy machine 3-6x slower instead of in proportion to the cores it lost.

Precision: weights are bf16 everywhere they travel (weight sync is bit-exact on bf16). Computing in fp32 from
bf16 weights is exact, so where a CPU has no bf16 instructions (an AVX2-only EPYC ran bf16 matrix products 5-8x
slower than fp32) the engines and the trainer compute in fp32, and nothing else changes. The choice reads CPU
flags, not a timing, so that it is the same on every run of one machine.
"""
from __future__ import annotations

import ctypes
import functools
import os
import platform

import torch

# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) under which it still runs bf16 natively
_BF16_ISAS = ("ALL", "AVX512_CORE_BF16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX",
              "AVX10_1_512_AMX_FP16", "AVX10_2_512_AMX_2")


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            line = next((x for x in f if x.startswith(("flags", "Features"))), "")
    except OSError:
        return set()
    return set(line.partition(":")[2].split())


# the instruction sets that decide what a matrix product computes and how fast (a bf16 product on avx512_bf16 is
# not the one on AMX or on AVX2)
_ISA_FLAGS = {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}


def isa() -> list[str]:
    """This CPU's flags among those that change a run's numbers."""
    return sorted(_cpu_flags() & _ISA_FLAGS)


def cpu_kind() -> str:
    """The CPU kind a run's numbers belong to (x86_64-avx2-avx512_bf16-avx512f): the bf16 goldens and the main
    job's runs on other CPUs (`make results-cpus`) are filed under it."""
    return "-".join([platform.machine(), *isa()])


def native_bf16(device: torch.device) -> tuple[bool, str]:
    """(whether `device` computes bf16 matrix products natively, why)."""
    if device.type == "cuda":
        return True, "CUDA"
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if isa and isa not in _BF16_ISAS:
        return False, f"ONEDNN_MAX_CPU_ISA={isa} caps oneDNN below bf16 instructions"
    have = sorted(_cpu_flags() & {"avx512_bf16", "amx_bf16"})
    return (True, f"CPU has {'+'.join(have)}") if have else (False, "CPU has no avx512_bf16/amx_bf16")


def compute_dtype(setting: str, device: torch.device) -> tuple[torch.dtype, str]:
    """The dtype to compute in for `setting` (auto | bfloat16 | float32), with the reason to log."""
    if setting == "bfloat16":
        return torch.bfloat16, "set to bfloat16"
    if setting == "float32":
        return torch.float32, "set to float32"
    if setting != "auto":
        raise ValueError(f"compute_dtype={setting!r}: must be auto, bfloat16 or float32")
    fast, why = native_bf16(device)
    return (torch.bfloat16 if fast else torch.float32), f"auto: {why}"


def allowed_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def cpu_plan(groups: list[int], cpus: list[int], placement: str) -> list[list[int]]:
    """Cores for each global rank, for groups of `groups[i]` ranks in rank order (trainers, then rollouts), as
    `placement` says (module docstring)."""
    if not cpus:
        raise ValueError("no CPU to place ranks on")
    if placement == "alternate" or len(groups) == 1 or len(cpus) < len(groups):
        return [c for n in groups for c in _deal(n, cpus)]
    if placement != "split":
        raise ValueError(f"cluster.placement={placement!r}: must be alternate or split")
    out, start, total = [], 0, sum(groups)
    for i, n in enumerate(groups):
        left = len(groups) - i - 1  # every later group keeps at least one core
        size = len(cpus) - start - left if i == len(groups) - 1 else max(1, round(len(cpus) * n / total))
        size = min(size, len(cpus) - start - left)
        out += _deal(n, cpus[start:start + size])
        start += size
    return out


def _deal(n: int, cpus: list[int]) -> list[list[int]]:
    """n near-equal contiguous shares of `cpus`; more ranks than cores share them round-robin."""
    if n >= len(cpus):
        return [[cpus[i % len(cpus)]] for i in range(n)]
    q, r = divmod(len(cpus), n)
    out, start = [], 0
    for i in range(n):
        size = q + (i < r)
        out.append(cpus[start:start + size])
        start += size
    return out


def describe(plan: list[list[int]], roles: list[str], names: list[str]) -> str:
    return ", ".join(f"{n.replace('rank', 'rank ')} ({role}) cores {','.join(map(str, c))}"
                     for n, role, c in zip(names, roles, plan))


def return_free_memory() -> None:
    """Give the pages glibc's heap holds free back to the system. A trainer step frees tensors of every size
    from 4 KB to 400 MB; glibc keeps the freed middle-sized ones in its heap, so on the CPU demo each trainer's
    resident memory grew from 4 to 7.3 GiB over ten warm-start steps and the four ranks reached the machine's
    24 GiB. A fixed mmap threshold (1 MiB) held them at ~5 GiB but made each step 35-45% slower (page faults)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to give back this way
        return None
