"""Building the codec's C++ kernel: a lock left by a killed build is broken, a live holder is waited for (a
bounded, configured wait) and then the torch path is used, a failed build is reported and falls back, the CLI.

Nothing here depends on timing: a holder is dead or alive because the test made it so, waits end on events.
The fast tests replace the compile step with stand-ins; test_real_build_killed_midway_is_rebuilt compiles (a
second).
"""
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import types

import pytest

from searchr1.weightsync import kernel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fake_module(build_dir):
    return types.SimpleNamespace(__file__=str(build_dir / "fake.so"))


@pytest.fixture
def fake_compiler(monkeypatch):
    """_compile and _load_built stand-ins: a 'build' writes nothing but records that it ran."""
    built = []

    def compile_(build_dir, name):
        built.append(build_dir)
        return _fake_module(build_dir)

    monkeypatch.setattr(kernel, "_compile", compile_)
    monkeypatch.setattr(kernel, "_load_built", lambda build_dir, name: _fake_module(build_dir))
    return built


def _child(tmp_path, body: str) -> subprocess.Popen:
    """A process in its own process group (so that killing it also kills what it started) running `body`."""
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {ROOT!r})
        from pathlib import Path
        from searchr1.weightsync import kernel
        root = Path({str(tmp_path)!r})
    """) + textwrap.dedent(body)
    return subprocess.Popen([sys.executable, "-c", script], start_new_session=True)


def _wait_for(path, proc) -> None:
    """Until `path` exists (the child got there) or the child exits (then the test fails)."""
    while not path.exists():
        assert proc.poll() is None, f"child exited with {proc.returncode} before creating {path}"
        threading.Event().wait(0.02)


def _kill(proc) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_stale_lock_of_a_killed_build_is_broken_and_the_run_goes_on(tmp_path, fake_compiler, caplog):
    build_dir = tmp_path / kernel.module_name()
    child = _child(tmp_path, """
        def stuck(build_dir, name):  # a build that leaves its source copy and half a library, then hangs
            (build_dir / "kernel.cpp").touch()
            (build_dir / "kernel.so.partial").write_bytes(b"half")
            (root / "building").touch()
            time.sleep(3600)
        kernel._compile = stuck
        kernel.prepare(root=root)
    """)
    _wait_for(tmp_path / "building", child)
    _kill(child)
    holder = json.loads((build_dir / "searchr1.lock").read_text())
    assert holder["pid"] == child.pid and (build_dir / "kernel.so.partial").exists()

    with caplog.at_level(logging.INFO, logger="searchr1.weightsync.kernel"):
        assert kernel.prepare(root=tmp_path, wait_s=0.0) is True
    assert "breaking the build lock" in caplog.text and "no longer running" in caplog.text
    assert "building the delta codec kernel (once per installation)" in caplog.text
    assert fake_compiler == [build_dir]
    assert not (build_dir / "kernel.so.partial").exists()  # the killed build's leftovers too
    assert not (build_dir / "searchr1.lock").exists() and (build_dir / "built.json").exists()
    assert kernel.prepare(root=tmp_path, wait_s=0.0) is True and fake_compiler == [build_dir]  # now only loads


def test_live_holder_is_waited_for_then_the_torch_path_is_used(tmp_path, fake_compiler, caplog):
    build_dir = tmp_path / kernel.module_name()
    child = _child(tmp_path, """
        build_dir = root / kernel.module_name()
        build_dir.mkdir(parents=True)
        assert kernel.acquire(build_dir / "searchr1.lock", 0.0, 0.01)
        (root / "holding").touch()
        time.sleep(3600)
    """)
    try:
        _wait_for(tmp_path / "holding", child)
        with caplog.at_level(logging.INFO, logger="searchr1.weightsync.kernel"):
            assert kernel.prepare(root=tmp_path, wait_s=0.2, poll_s=0.01) is False
        assert "waiting up to" in caplog.text and "still held" in caplog.text and "torch path" in caplog.text
        assert json.loads((build_dir / "searchr1.lock").read_text())["pid"] == child.pid  # never broken
        assert fake_compiler == []
    finally:
        _kill(child)


def test_a_waiter_takes_the_build_its_holder_finished(tmp_path, fake_compiler):
    build_dir = tmp_path / kernel.module_name()
    build_dir.mkdir(parents=True)
    lock = build_dir / "searchr1.lock"
    assert kernel.acquire(lock, 0.0, 0.01)  # this process holds it: alive for as long as the test runs

    class FinishWhenWaited(logging.Handler):
        def emit(self, record):
            if "waiting up to" in record.getMessage():  # the waiter is in its wait: the holder finishes
                (build_dir / "built.json").write_text(json.dumps({"file": "fake.so"}))
                lock.unlink()

    handler = FinishWhenWaited()
    log = logging.getLogger("searchr1.weightsync.kernel")
    log.addHandler(handler)
    old_level = log.level
    log.setLevel(logging.INFO)
    try:
        assert kernel.prepare(root=tmp_path, wait_s=3600, poll_s=0.01) is True
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)
    assert fake_compiler == []  # loaded what the holder built


def test_failed_build_is_reported_and_falls_back_to_the_torch_path(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    build_dir = tmp_path / kernel.module_name()
    with caplog.at_level(logging.INFO, logger="searchr1.weightsync.kernel"):
        assert kernel.prepare(root=tmp_path, wait_s=0.0) is False
    assert "build failed" in caplog.text and "using the torch path" in caplog.text
    assert (build_dir / "failed.json").exists() and not (build_dir / "searchr1.lock").exists()

    def must_not_compile(*_):
        raise AssertionError("a recorded failure is not retried inside a run")

    monkeypatch.setattr(kernel, "_compile", must_not_compile)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="searchr1.weightsync.kernel"):
        assert kernel._build(build_dir, 0.0, 0.01, retry_failed=False) is None
    assert "an earlier build failed" in caplog.text


def test_cli_reports_and_strict_fails_without_a_compiler(tmp_path):
    env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"), kernel.ENV_DIR: str(tmp_path),
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "searchr1.weightsync.kernel", "--wait-s", "0"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert p.returncode == 0 and "unavailable, the torch path will be used" in p.stdout
    assert "building the delta codec kernel (once per installation)" in p.stderr
    assert subprocess.run(cmd + ["--strict"], env=env, capture_output=True, text=True).returncode == 1


def test_build_directory_is_keyed_by_the_installation(monkeypatch):
    key = kernel.build_key()
    try:
        with monkeypatch.context() as m:
            m.setattr(sys, "prefix", "/some/other/venv")
            kernel.build_key.cache_clear()
            assert kernel.build_key() != key
    finally:
        kernel.build_key.cache_clear()
    assert kernel.module_name().endswith(key)


def test_real_build_killed_midway_is_rebuilt(tmp_path):
    """The build killed while its compiler runs (a stand-in compiler that waits to be killed, so the kill lands
    mid-build whatever the machine's speed), then a real build by the next process, which breaks the lock."""
    build_dir = tmp_path / kernel.module_name()
    mark = tmp_path / "compiler-started"
    fake = tmp_path / "cxx"
    fake.write_text(f"#!/bin/sh\ntouch {mark}\nexec sleep 3600\n")
    fake.chmod(0o755)
    child = _child(tmp_path, f"import os; os.environ['CXX'] = {str(fake)!r}; kernel.prepare(root=root)")
    _wait_for(mark, child)
    _kill(child)
    assert (build_dir / "searchr1.lock").exists() and not (build_dir / "built.json").exists()
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {ROOT!r})
        from searchr1.weightsync import kernel
        assert kernel.prepare(root={str(tmp_path)!r}, wait_s=0.0)
        mod = kernel._load_built(kernel.Path({str(build_dir)!r}), {kernel.module_name()!r})
        x = torch.arange(300, dtype=torch.int16)
        assert tuple(mod.digest(x, 0)) == (44850, 8955050)
    """)], capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != "CXX"})
    assert p.returncode == 0, p.stderr[-2000:]
    assert "breaking the build lock" in p.stderr
    left = sorted(f.name for f in build_dir.iterdir() if not f.name.endswith(".guard"))
    assert left == ["built.json", "kernel.cpp", "kernel.so"]


def test_malformed_input_raises_the_kernels_message(tmp_path):
    """The C library's checks surface as RuntimeError with its message; the tensor checks are kernel.py's."""
    import torch

    assert kernel.prepare(root=tmp_path, wait_s=0.0)
    mod = kernel._load_built(tmp_path / kernel.module_name(), kernel.module_name())
    i16 = torch.zeros(4, dtype=torch.int16)
    with pytest.raises(RuntimeError, match="change index 8 is outside the window of 4 elements"):
        mod.apply_window(i16, torch.tensor([9], dtype=torch.uint8), torch.zeros(0, dtype=torch.int32),
                         torch.ones(1, dtype=torch.int16))
    with pytest.raises(RuntimeError, match="record has 1 gaps but 2 values"):
        mod.apply_window(i16, torch.tensor([1], dtype=torch.uint8), torch.zeros(0, dtype=torch.int32),
                         torch.ones(2, dtype=torch.int16))
    with pytest.raises(RuntimeError, match="tensor has dtype torch.int32, expected torch.int16"):
        mod.digest(torch.zeros(3, dtype=torch.int32), 0)
    with pytest.raises(RuntimeError, match="must be contiguous"):
        mod.digest(torch.zeros(8, dtype=torch.int16)[::2], 0)
    assert list(mod.digest(torch.arange(300, dtype=torch.int16), 0)) == [44850, 8955050]
