"""The package's shape: no import cycle among searchr1's modules, no file past the size a role should have."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "searchr1"
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
