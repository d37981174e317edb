"""The runtime's modules import each other without a cycle, lazy imports included (a static scan).

The transports are the case in point: the interface (``transport``) imports none of its
implementations; they import it, and the factory (``channels``) imports them all.
"""

from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"


def _runtime_imports(path: Path) -> set[str]:
    """The ``psgdlab.runtime`` modules that ``path`` imports anywhere in its body."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("psgdlab.runtime"):
            rest = node.module.removeprefix("psgdlab.runtime").lstrip(".")
            found |= {rest.split(".")[0]} if rest else {alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[2] for a in node.names if a.name.startswith("psgdlab.runtime.")}
    return found


def _graph() -> dict[str, set[str]]:
    return {p.stem: _runtime_imports(p) for p in sorted(RUNTIME.glob("*.py"))}


def test_the_transport_interface_imports_none_of_its_implementations():
    assert _graph()["transport"] == set()


def test_runtime_modules_import_each_other_without_a_cycle():
    graph = _graph()
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for dep in sorted(graph.get(name, ())):
            assert state.get(dep) != "open", "import cycle: " + " -> ".join(path[path.index(dep) :] + [dep])
            if dep not in state:
                visit(dep, path + [dep])
        state[name] = "done"

    for name in graph:
        if name not in state:
            visit(name, [name])
