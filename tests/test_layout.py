"""The layout holds: no import circle between modules anywhere in the tree, and layers point
one way (README "Where things live"). Function-local imports count: a circle is a tangle to
read even when it loads."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dart_jax", "envs", "rollout_gpu")
# bottom to top; a module may import its own layer and those below it
LAYERS = (
    ("dart_jax.config", "dart_jax.wire", "dart_jax.agent", "dart_jax.logs", "dart_jax.rundir"),
    ("dart_jax.models", "dart_jax.policy"),
    ("dart_jax.data", "envs", "dart_jax.train", "rollout_gpu"),
    ("dart_jax.eval", "dart_jax.observe", "dart_jax.capacity", "dart_jax.run", "dart_jax.testing", "dart_jax.cli"),
)
ROLES = ("dart_jax.data", "envs", "dart_jax.train", "rollout_gpu")  # talk over the wire, never by import


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The tree's modules that `name` imports (the deepest known module of each import)."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name and (t not in _packages_of(name)):
                found.add(t)
    return found


def _packages_of(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}  # a module's own packages load first


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def layer(name: str) -> tuple[int, str]:
    best = (-1, "")
    for rank, group in enumerate(LAYERS):
        for pkg in group:
            if (name == pkg or name.startswith(pkg + ".")) and len(pkg) > len(best[1]):
                best = (rank, pkg)
    return best


def test_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_in_the_tree():
    assert cycles(graph()) == []


def test_layers_point_one_way():
    wrong = []
    for name, targets in graph().items():
        (rank, pkg) = layer(name)
        for t in targets:
            trank, tpkg = layer(t)
            if trank > rank or (pkg in ROLES and tpkg in ROLES and tpkg != pkg):
                wrong.append(f"{name} -> {t}")
    assert wrong == []


def test_every_module_has_a_layer():
    assert [name for name in modules() if layer(name)[0] < 0 and name not in PACKAGES] == []
