"""The CPU kernel of the delta codec: C++ compiled once per installation, then imported in milliseconds.

Two record formats share one pass structure over the new and published int16 views: 32 elements per SIMD
compare, a bit mask of the differences, and for each set bit the change emitted and the published element
overwritten; the digest of each 256-element block is summed while the block is in L1.
- gap8 (encode_window / apply_window): byte gaps, int32 escapes and raw values.
- rice (rice_encode / rice_apply): one call per window samples the window (classes of old values, changes,
  value symbols), chooses every parameter with integer arithmetic that rice.py mirrors exactly, then codes
  each change straight into its bit streams during the pass; rice_apply walks the target's classes to turn
  ranks back into indices. rice.py documents the layout.
The digest of a full block uses int16 multiply-adds (exact: see digest256).
Semantics are defined by the torch paths in codec.py and rice.py, which produce identical bytes (tested).

Building: `prepare()` (also `python -m searchr1.weightsync.kernel`; `make install` runs it through
searchr1/prebuild.py) compiles the kernel with $CXX (else g++) into a plain shared library with a C ABI, loaded with
ctypes (no torch or Python headers: about a second to build, where the torch extension it was took ~30 s), in a
directory keyed by the interpreter prefix (the venv), this CPU's flags (the build uses -march=native)
and the source, under a lock file naming its holder (pid, host, process start time):
a holder that no longer runs on this host is dead and its lock is broken; a live one is waited for at most
`wait_s`, after which the caller uses the torch path. A failed build is recorded, logged, and the torch path
used; `load()` never retries a recorded failure (it runs inside the first weight publication, a collective),
`prepare()` does.
"""
from __future__ import annotations

import argparse
import ctypes
import functools
import hashlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from searchr1.flock import exclusive

log = logging.getLogger(__name__)

# The source lives beside this file (a C++ file reads and diffs as C++); its text is part of the build key.
_CPP = (Path(__file__).parent / "kernel.cpp").read_text()

_CFLAGS = ["-O3", "-march=native", "-std=c++17", "-shared", "-fPIC"]
_LIB = "kernel.so"
# Seconds a process waits for another one's build before it gives up and uses the torch path. Builds take
# about a second; a longer wait only happens when the holder lives on another host (liveness unknown).
WAIT_S = 300.0
POLL_S = 0.5
ENV_DIR = "SEARCHR1_KERNEL_DIR"  # overrides the build root (e.g. a node-local disk)

_kernel = None
_kernel_failed = False


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


@functools.lru_cache(maxsize=None)
def build_key() -> str:
    """What the compiled file depends on: the interpreter prefix (the venv), this CPU's flags (-march=native: a
    shared disk on a cluster of mixed nodes must never serve a build with instructions this CPU lacks), the
    compile flags and the source. (It links neither Python nor torch.)"""
    parts = [sys.prefix, _cpu_flags(), " ".join(_CFLAGS), _CPP]
    return hashlib.sha1("\0".join(parts).encode()).hexdigest()[:16]


def build_root() -> Path:
    """$SEARCHR1_KERNEL_DIR, else under the venv when it is writable, else under ~/.cache."""
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR])
    in_venv = Path(sys.prefix) / "var" / "searchr1" / "kernels"
    probe = next((p for p in [in_venv, *in_venv.parents] if p.exists()), None)
    if probe is not None and os.access(probe, os.W_OK):
        return in_venv
    return Path.home() / ".cache" / "searchr1" / "kernels"


def module_name() -> str:
    return f"searchr1_codec_{build_key()}"


# ---------------------------------------------------------------- the lock

def _start_time(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (/proc), which tells a reused pid from its holder."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _holder_alive(holder: dict) -> Optional[bool]:
    """True/False for a holder on this host; None when it lives elsewhere (its liveness cannot be seen)."""
    if holder.get("host") != socket.gethostname():
        return None
    pid = int(holder.get("pid", -1))
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    started = holder.get("started")
    return started is None or _start_time(pid) in (None, started)


def _read_holder(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: treated as a dead holder on this host below


def _try_lock(path: Path) -> bool:
    """Create the lock with its content in one step (link of a written file), so no reader sees it empty."""
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": _start_time(os.getpid())}
    tmp = path.with_name(f"{path.name}.{me['host']}.{me['pid']}")
    tmp.write_text(json.dumps(me))
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def acquire(path: Path, wait_s: float, poll_s: float) -> bool:
    """Take the build lock at `path`, breaking it when its holder is dead, waiting at most `wait_s` for a
    live one. False: still held by a live (or remote) holder after the wait."""
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        if _try_lock(path):
            return True
        holder = _read_holder(path)
        if holder is not None and (holder == {} or _holder_alive(holder) is False):
            # serialised: two waiters that both see a dead holder must not both delete (one would delete the
            # other's fresh lock)
            with exclusive(path.with_name(path.name + ".guard")):
                if _read_holder(path) == holder:
                    log.warning("delta codec kernel: breaking the build lock %s left by %s (no longer running)",
                                path, holder or "an unreadable holder")
                    path.unlink(missing_ok=True)
            continue
        if time.monotonic() >= deadline:
            return False
        if not said:
            log.info("delta codec kernel: waiting up to %.0f s for the build by %s", wait_s, holder)
            said = True
        time.sleep(poll_s)


# ---------------------------------------------------------------- build and load

def _compiler() -> str:
    return os.environ.get("CXX") or "g++"


class Kernel:
    """The compiled library's five functions on tensors (what codec.py calls): each tensor is checked here
    (on the CPU, contiguous, its dtype) and passed as (pointer, element count); results come back as the
    library writes them, a malformed input as RuntimeError with the library's message."""

    def __init__(self, path: Path):
        import torch

        self.__file__ = str(path)
        self._i16, self._i32, self._u8 = torch.int16, torch.int32, torch.uint8
        lib = self._lib = ctypes.CDLL(str(path))
        p, i = ctypes.c_void_p, ctypes.c_int64
        sigs = {"encode_window": [p, i, p, i, p, i, p, i, p, i, i, p], "apply_window": [p, i, p, i, p, i, p, i],
                "digest": [p, i, i, p], "rice_encode": [p, i, p, i, p, i, i, i, p], "rice_apply": [p, i, p, i, i]}
        for name, args in sigs.items():
            f = getattr(lib, f"searchr1_{name}")
            f.argtypes, f.restype = args, i
        lib.searchr1_error.argtypes, lib.searchr1_error.restype = [], ctypes.c_char_p

    @staticmethod
    def _t(t, name: str, dtype) -> tuple[int, int]:
        if t.device.type != "cpu":
            raise RuntimeError(f"{name} must be on the CPU")
        if not t.is_contiguous():
            raise RuntimeError(f"{name} must be contiguous")
        if t.dtype != dtype:
            raise RuntimeError(f"{name} has dtype {t.dtype}, expected {dtype}")
        return t.data_ptr(), t.numel()

    def _call(self, name: str, *args) -> int:
        rc = getattr(self._lib, f"searchr1_{name}")(*args)
        if rc < 0:
            raise RuntimeError(self._lib.searchr1_error().decode())
        return rc

    def encode_window(self, nw, pub, gaps, esc, vals, offset: int) -> list[int]:
        ret = (ctypes.c_int64 * 4)()
        self._call("encode_window", *self._t(nw, "new", self._i16), *self._t(pub, "published", self._i16),
                   *self._t(gaps, "gaps", self._u8), *self._t(esc, "escapes", self._i32),
                   *self._t(vals, "values", self._i16), offset, ret)
        return list(ret)

    def apply_window(self, dst, gaps, esc, vals) -> None:
        self._call("apply_window", *self._t(dst, "target", self._i16), *self._t(gaps, "gaps", self._u8),
                   *self._t(esc, "escapes", self._i32), *self._t(vals, "values", self._i16))

    def digest(self, x, offset: int) -> list[int]:
        ret = (ctypes.c_int64 * 2)()
        self._call("digest", *self._t(x, "tensor", self._i16), offset, ret)
        return list(ret)

    def rice_encode(self, nw, pub, out, offset: int, classes: bool) -> list[int]:
        ret = (ctypes.c_int64 * 5)()
        self._call("rice_encode", *self._t(nw, "new", self._i16), *self._t(pub, "published", self._i16),
                   *self._t(out, "out", self._i32), offset, int(classes), ret)
        return list(ret)

    def rice_apply(self, dst, words, count: int) -> int:
        return self._call("rice_apply", *self._t(dst, "target", self._i16),
                          *self._t(words, "payload", self._i32), count)


def _compile(build_dir: Path, name: str) -> Kernel:
    """Compile to a temporary name and rename it into place: a killed build leaves no half-written library."""
    src, tmp = build_dir / "kernel.cpp", build_dir / f"{_LIB}.partial"
    src.write_text(_CPP)
    p = subprocess.run([_compiler(), *_CFLAGS, str(src), "-o", str(tmp)], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{_compiler()} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
    os.replace(tmp, build_dir / _LIB)
    return Kernel(build_dir / _LIB)


def _load_built(build_dir: Path, name: str) -> Kernel:
    return Kernel(build_dir / json.loads((build_dir / "built.json").read_text())["file"])


def _clear(build_dir: Path, keep: set[str]) -> None:
    """Remove what an interrupted build left (the source copy, a partial library)."""
    for p in build_dir.iterdir():
        if p.name in keep:
            continue
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _build(build_dir: Path, wait_s: float, poll_s: float, retry_failed: bool):
    """The module from `build_dir`, building it there first if needed; None (logged) when it cannot be had."""
    name = build_dir.name
    done, failed = build_dir / "built.json", build_dir / "failed.json"
    if done.exists():
        try:
            return _load_built(build_dir, name)
        except Exception as e:  # noqa: BLE001 - a damaged build is rebuilt below
            log.warning("delta codec kernel: cannot import %s (%s); rebuilding", build_dir, e)
    if failed.exists() and not retry_failed:
        log.warning("delta codec kernel: an earlier build failed (%s); using the torch path",
                    failed.read_text().strip()[:300])
        return None
    build_dir.mkdir(parents=True, exist_ok=True)
    lock = build_dir / "searchr1.lock"
    if not acquire(lock, wait_s, poll_s):
        log.warning("delta codec kernel: %s is still held after %.0f s; using the torch path", lock, wait_s)
        return None
    try:
        if done.exists():  # built by the holder we waited for
            return _load_built(build_dir, name)
        if failed.exists() and not retry_failed:
            return None
        _clear(build_dir, keep={lock.name, lock.name + ".guard"})
        log.info("building the delta codec kernel (once per installation) in %s ...", build_dir)
        t0 = time.perf_counter()
        try:
            mod = _compile(build_dir, name)
        except Exception as e:  # noqa: BLE001 - any build failure leaves the (identical) torch path
            failed.write_text(f"{type(e).__name__}: {e}")
            log.warning("delta codec kernel: build failed (%s: %s); using the torch path",
                        type(e).__name__, str(e).strip()[-300:])
            return None
        done.write_text(json.dumps({"file": Path(mod.__file__).name, "seconds": round(time.perf_counter() - t0, 1)}))
        log.info("delta codec kernel built in %.0f s", time.perf_counter() - t0)
        return mod
    finally:
        lock.unlink(missing_ok=True)


def prepare(root: Optional[str | Path] = None, wait_s: float = WAIT_S, poll_s: float = POLL_S) -> bool:
    """Build (or load) the kernel now, before any rank starts publishing: True when it is usable. With the
    default root the loaded module is the one the codec uses; a recorded failed build is retried."""
    global _kernel, _kernel_failed
    default = root is None
    if default and _kernel is not None:
        return True
    build_dir = Path(root or build_root()) / module_name()
    mod = _build(build_dir, wait_s, poll_s, retry_failed=True)
    if default:
        _kernel, _kernel_failed = mod, mod is None
    return mod is not None


def load():
    """The compiled module, or None when it cannot be had here: callers use the torch path. Inside a run this
    normally only imports what `prepare()` built; it builds (once) when nothing was prepared."""
    global _kernel, _kernel_failed
    if _kernel is None and not _kernel_failed:
        try:
            _kernel = _build(build_root() / module_name(), WAIT_S, POLL_S, retry_failed=False)
        except Exception as e:  # noqa: BLE001 - e.g. an unwritable build root: the torch path still works
            log.warning("delta codec kernel unavailable (%s); using the torch path", e)
            _kernel = None
        _kernel_failed = _kernel is None
    return _kernel


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="Build the delta codec's C++ kernel for this installation.")
    ap.add_argument("--wait-s", type=float, default=WAIT_S, help="wait this long for another process's build")
    ap.add_argument("--strict", action="store_true", help="exit 1 when the kernel cannot be built")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ok = prepare(wait_s=a.wait_s)
    where = build_root() / module_name()
    print(f"delta codec kernel: {'ready' if ok else 'unavailable, the torch path will be used'} ({where})")
    return 0 if ok or not a.strict else 1


if __name__ == "__main__":
    sys.exit(main())
