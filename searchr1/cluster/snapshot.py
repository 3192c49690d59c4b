"""The code a Slurm job runs: a copy of the checkout made at submission, and the environment it was made in.

A requeued job starts again hours later, from the same batch script: without a copy it would run whatever the
checkout holds by then (a `git pull`, an edit). `take` copies every file git knows of (tracked, and untracked
ones that are not ignored, as the working tree has them) into `run_dir/code`, and records in
`run_dir/code.json` the commit, whether the tree differed from it (then `run_dir/code.diff` holds the
difference), and the interpreter with its installed packages. The interpreter itself is not copied (a
virtual environment is gigabytes): `changed_packages` tells each start of the job what differs since.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

RECORD = "code.json"
DIFF = "code.diff"


class SnapshotError(RuntimeError):
    """The checkout cannot be copied (not a git checkout, git missing)."""


def _git(root: Path, *args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SnapshotError(f"git {' '.join(args)} in {root}: {err}") from None
    if out.returncode != 0:
        raise SnapshotError(f"git {' '.join(args)} in {root}: {out.stderr.strip()}")
    return out.stdout


def packages() -> dict[str, str]:
    """name -> version of every distribution the running interpreter sees."""
    return {d.metadata["Name"].lower(): d.version for d in metadata.distributions() if d.metadata["Name"]}


def take(root: Path, dest: Path, record_dir: Path) -> dict:
    """Copy the checkout at `root` into `dest`; write the record (code.json, code.diff) into `record_dir`."""
    root, dest = Path(root), Path(dest)
    files = [f for f in _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0") if f]
    commit = _git(root, "rev-parse", "HEAD").strip()
    diff = _git(root, "diff", "--binary", "HEAD")
    untracked = [f for f in _git(root, "ls-files", "-z", "--others", "--exclude-standard").split("\0") if f]
    copied = 0
    for name in files:
        src = root / name
        if not src.is_file():  # deleted in the working tree, or a submodule
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
        copied += src.stat().st_size
    info = {"source": str(root), "commit": commit, "dirty": bool(diff or untracked), "untracked": untracked,
            "files": len(files), "bytes": copied, "python": sys.executable, "packages": packages()}
    if diff:
        (Path(record_dir) / DIFF).write_text(diff)
    (Path(record_dir) / RECORD).write_text(json.dumps(info, indent=1) + "\n")
    return info


def changed_packages(record_dir: Path) -> list[str]:
    """Packages of this interpreter that differ from those recorded at submission ("torch 2.13.0 -> 2.14.0")."""
    path = Path(record_dir) / RECORD
    if not path.is_file():
        return []
    then, now = json.loads(path.read_text())["packages"], packages()
    return [f"{name} {then.get(name, '(none)')} -> {now.get(name, '(none)')}"
            for name in sorted(set(then) | set(now)) if then.get(name) != now.get(name)]
