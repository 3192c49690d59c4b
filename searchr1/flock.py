"""An exclusive advisory lock on a file, held for a `with` block (fcntl: released by the kernel if the holder
dies, so a crash never leaves it held)."""
from __future__ import annotations

import fcntl
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def exclusive(path: str | Path):
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
