"""The modules of the runtime and of the models import each other without a cycle, lazy imports
included (the static scan of ``tests/test_layering.py``), and no folder of theirs grows past a
dozen modules.

The transports are the case in point: the interface (``transports.transport``) imports none of
its implementations; they import it, and the factory (``transports.channels``) imports them all.
"""

from __future__ import annotations

from pathlib import Path

from psgdlab.tests.test_layering import ROOT, imports_of, module_name

#: the layers whose module graph is checked here, and the most modules one folder of theirs holds
LAYERS = ("runtime", "models")
MAX_MODULES_PER_FOLDER = 12


def _graph() -> dict[str, set[str]]:
    """Module -> the modules of :data:`LAYERS` it imports anywhere in its body."""
    paths = {module_name(path, layer): (path, layer) for layer in LAYERS for path in (ROOT / layer).rglob("*.py")}
    return {
        name: {imp.module for imp in imports_of(path, layer) if imp.module in paths and imp.module != name}
        for name, (path, layer) in sorted(paths.items())
    }


def test_the_transport_interface_imports_none_of_its_implementations():
    graph = _graph()
    assert graph["psgdlab.runtime.transports.transport"] == set()
    implementations = {"psgdlab.runtime.transports.torch_dist", "psgdlab.runtime.transports.mpi"}
    assert all("psgdlab.runtime.transports.transport" in graph[m] for m in implementations)
    assert implementations <= graph["psgdlab.runtime.transports.channels"]


def test_runtime_and_model_modules_import_each_other_without_a_cycle():
    graph = _graph()
    assert len(graph) > 40  # the scan sees the subpackages
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


def test_no_folder_holds_more_than_a_dozen_modules():
    folders: dict[Path, int] = {}
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            if path.name != "__init__.py":
                folders[path.parent] = folders.get(path.parent, 0) + 1
    crowded = {str(f.relative_to(ROOT)): n for f, n in folders.items() if n > MAX_MODULES_PER_FOLDER}
    assert not crowded, f"folders of more than {MAX_MODULES_PER_FOLDER} modules: {crowded}"
