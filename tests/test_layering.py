"""The package layering of docs/architecture.md, checked from the source's own imports.

Reads every module of ``jaxinfer`` (and ``server.py``) with `ast`, module-level and
function-level imports alike, and checks the table `FORBIDDEN` (package -> packages it may not
import; None: nothing of jaxinfer outside itself), that ``core`` and ``config`` import no JAX
(also by importing them in a fresh interpreter, so a JAX import two modules away fails too),
that the front doors (``entrypoints``, ``server.py``) import neither ``runner`` nor ``layers``,
and that no module-level import circle exists.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import assert_imports_no_jax

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jaxinfer"
JAX_ROOTS = {"jax", "jaxlib", "flax", "orbax"}

# package (first name under jaxinfer) -> packages it must not import (None: all of jaxinfer
# outside itself)
FORBIDDEN = {
    "core": {"engine", "runner", "layers", "models", "kernels", "platform", "entrypoints", "distributed"},
    # config reads the JAX-free registries (attention backends' names, model families' config
    # hooks) of layers and models; the run-time check below keeps them JAX-free
    "config": {"engine", "runner", "kernels", "entrypoints", "distributed"},
    "kernels": None,
    "models": {"kernels", "platform", "runner", "engine", "entrypoints"},
    "layers": {"runner", "engine", "entrypoints"},
    "entrypoints": {"runner", "layers"},
}
FRONT_DOOR_SCRIPTS = ("server.py",)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, toplevel_only: bool = False) -> set[str]:
    """Dotted names ``path`` imports (``from a import b`` gives ``a.b`` and ``a``)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if toplevel_only else ast.walk(tree)
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
        elif toplevel_only and isinstance(node, (ast.If, ast.Try)) and not _not_on_import(node):
            out |= imports_of_block(node)  # guarded imports still run
    return out


def _not_on_import(node) -> bool:
    """``if __name__ == "__main__":`` and ``if TYPE_CHECKING:`` bodies do not run on import."""
    test = ast.unparse(node.test) if isinstance(node, ast.If) else ""
    return "__name__" in test or "TYPE_CHECKING" in test


def imports_of_block(block) -> set[str]:
    mod = ast.Module(body=[n for n in ast.walk(block) if isinstance(n, (ast.Import, ast.ImportFrom))],
                     type_ignores=[])
    out = set()
    for node in mod.body:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif node.module and not node.level:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def package_of(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if parts[0] == "jaxinfer" and len(parts) > 1 else None


def violations(path: Path, pkg: str) -> list[str]:
    rule = FORBIDDEN[pkg]
    bad = []
    for name in sorted(imports(path)):
        root, target = name.split(".")[0], package_of(name)
        if pkg in ("core", "config") and root in JAX_ROOTS:
            bad.append(name)
        elif root == "jaxinfer" and target is not None and target != pkg:
            if (rule is None and (PACKAGE / target).exists()) or (rule is not None and target in rule):
                bad.append(name)
    return bad


@pytest.mark.parametrize("pkg", sorted(FORBIDDEN))
def test_package_imports_follow_the_table(pkg):
    found = {module_name(p): violations(p, pkg) for p in sorted((PACKAGE / pkg).rglob("*.py"))}
    assert (PACKAGE / pkg).is_dir()
    assert {m: v for m, v in found.items() if v} == {}


def test_front_door_scripts_import_no_runner_or_layers():
    for script in FRONT_DOOR_SCRIPTS:
        bad = [n for n in imports(ROOT / script) if package_of(n) in FORBIDDEN["entrypoints"]]
        assert bad == [], script


def test_core_and_config_import_no_jax_at_run_time():
    mods = [module_name(p) for pkg in ("core", "config") for p in sorted((PACKAGE / pkg).rglob("*.py"))]
    assert_imports_no_jax("; ".join(f"import {m}" for m in mods), cwd=ROOT)


def module_graph() -> dict[str, set[str]]:
    """Module -> the jaxinfer modules it imports at module level."""
    mods = {module_name(p): p for p in sources()}
    graph = {}
    for m, p in mods.items():
        graph[m] = {n for n in imports(p, toplevel_only=True) if n in mods and n != m}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, 1972)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    graph = module_graph()
    # a package __init__ that re-exports its modules is not a circle with them
    for m in list(graph):
        graph[m] = {n for n in graph[m] if not m.startswith(n + ".")}
    assert cycles(graph) == []


def test_the_checks_see_a_forbidden_import(tmp_path):
    """The rules are not vacuous: a models module importing a kernel is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from jaxinfer.kernels.cpu import amx\n")
    assert violations(bad, "models") == ["jaxinfer.kernels.cpu", "jaxinfer.kernels.cpu.amx"]
    assert violations(bad, "layers") == []
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
