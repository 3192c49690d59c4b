"""The package's shape: no import cycle among searchr1's modules, no file past the size a role should have; and
the suite's own scheduling."""
import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "searchr1"
MAX_LINES = 400


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """Every searchr1 module this file imports, at module level or inside functions (a lazy import still
    ties the two modules together)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("searchr1")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("searchr1"):
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PKG.rglob("*.py")}
    g = {}
    for name, path in files.items():
        deps = {d for d in imports(path) if d in files and d != name}
        # `from searchr1 import x` names the package; the edge is to the submodule when there is one
        g[name] = {d for d in deps if not any(o.startswith(d + ".") and o in deps for o in deps)} - {"searchr1"}
    return g


def test_no_import_cycle():
    g = graph()
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        path.append(n)
        for m in sorted(g[n]):
            if state.get(m) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(m):] + [m]))
            if m not in state:
                visit(m)
        path.pop()
        state[n] = 2

    for n in sorted(g):
        if n not in state:
            visit(n)


def test_no_module_past_the_size_of_one_role():
    big = {str(p.relative_to(PKG.parent)): n for p in PKG.rglob("*.py")
           if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, big


def test_the_suites_groups_share_a_worker(tmp_path):
    """`make test`'s scheduler (tests/conftest.py) keeps a group's modules on one worker: two modules put in one
    group run in the same worker, whichever is free. (pytest-xdist's own `xdist_group` marks did nothing under
    pytest 9, silently; this fails if the scheduler is bypassed the same way.)"""
    (tmp_path / "conftest.py").write_text(
        "import tests.conftest as suite\n"
        "suite.GROUPS.update({'test_x': 'together', 'test_y': 'together'})\n"
        "pytest_xdist_make_scheduler = suite.pytest_xdist_make_scheduler\n")
    for name in ("test_x", "test_y", "test_z"):
        (tmp_path / f"{name}.py").write_text(
            "import os, pathlib, time\n"
            "def test_where():\n"
            "    time.sleep(0.5)\n"
            f"    pathlib.Path(r'{tmp_path}', '{name}.worker').write_text(os.environ['PYTEST_XDIST_WORKER'])\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadscope", "-p",
                        "no:cacheprovider", "-c", "/dev/null", "--rootdir", str(tmp_path), str(tmp_path)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    x, y = ((tmp_path / f"{n}.worker").read_text() for n in ("test_x", "test_y"))
    assert x == y, (x, y)
