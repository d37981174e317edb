"""Dependencies point one way: core <- {sim, models} <- runtime <- psgdlab (CLI, pipelines);
core <- analysis <- psgdlab; inside the runtime, transports and failures <- loop <- launcher; and
inside core, errors and config <- {stats, graphs} <- algorithms <- platform <- records <- convergence.

Three checks:

- a static one: every import statement of every module of the package (lazy ones inside
  functions included, relative ones resolved, ``importlib.import_module("...")`` with a literal
  name too) is read from the source with :mod:`ast` and checked against the layer's rule below;
- the same scan inside the runtime and inside core, against the rule of each of their parts
  (:data:`RUNTIME_PARTS`, :data:`CORE_PARTS`), rules that themselves have no circle;
- an import-time one: importing the light entry points loads none of the heavy libraries.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: layer -> (source folder, the package layers it may import, the third-party roots it may import)
LAYERS: dict[str, tuple[str, frozenset[str], frozenset[str]]] = {
    "core": (
        "core",
        frozenset({"core"}),
        # networkx in the adapters and hypothesis in the exported strategies, both extras;
        # that importing core loads neither is checked at import time below
        frozenset({"numpy", "scipy", "networkx", "hypothesis"}),
    ),
    "sim": ("sim", frozenset({"core", "sim"}), frozenset({"numpy", "scipy", "simpy", "tqdm"})),
    # what the trainer and the emulator both use: no transport, no launcher, no simulator
    "models": (
        "models",
        frozenset({"core", "models"}),
        frozenset({"numpy", "scipy", "torch", "h5py", "kaldiio", "jiwer", "tqdm"}),
    ),
    "runtime": ("runtime", frozenset({"core", "models", "runtime"}), frozenset({"numpy", "torch", "mpi4py", "tqdm"})),
    "analysis": ("analysis", frozenset({"core", "analysis"}), frozenset({"numpy", "scipy", "matplotlib"})),
    "cli": ("psgdlab", frozenset({"core", "sim", "models", "runtime", "analysis", "cli"}), frozenset({"*"})),
}
#: the import package of each layer
PACKAGES = {
    "core": "psgdlab.core",
    "sim": "psgdlab.sim",
    "models": "psgdlab.models",
    "runtime": "psgdlab.runtime",
    "analysis": "psgdlab.analysis",
    "cli": "psgdlab",
}

#: the runtime's parts (a module belongs to the longest one its name under ``psgdlab.runtime``
#: starts with) -> the other parts it may import (a part names its subparts too); ``None``: any
_TRANSPORT_IMPLEMENTATIONS = ("transports.torch_dist", "transports.mpi", "transports.shm")
RUNTIME_PARTS: dict[str, frozenset[str] | None] = {
    # the transports: the interface and the launcher's environment import nothing of the
    # runtime, the implementations the interface, the factory (channels) all of them
    "transports": frozenset(),  # the package, and a module of it not named below
    "transports.env": frozenset(),
    "transports.backends": frozenset(),
    "transports.transport": frozenset(),
    "transports.torch_dist": frozenset({"transports.transport"}),
    "transports.mpi": frozenset({"transports.transport"}),
    "transports.shm": frozenset({"transports.transport", "transports.env", "transports.torch_dist"}),
    "transports.channels": frozenset(
        {"transports.transport", "transports.env", "transports.backends", *_TRANSPORT_IMPLEMENTATIONS}
    ),
    # what a run does about failures: imports nothing else of the runtime
    "failures": frozenset(),
    "failures.flight": frozenset(),
    "failures.stop": frozenset({"failures.flight"}),
    "failures.survive": frozenset(),
    # the training loop talks to the transport interface, never to an implementation, and
    # never to a launcher
    "loop": frozenset({"transports.transport", "transports.env", "failures.flight", "failures.survive"}),
    # the resolved run configuration: models and core, and the names of the transports' backends
    "config": frozenset({"transports.backends"}),
    # starting ranks: the top of the runtime below the entries; nothing else imports it
    "launcher": frozenset({"config", "loop", "failures", "transports"}),
    # the entries: one rank's run, ``python -m psgdlab.runtime``, the package's lazy exports
    "train": None,
    "__main__": None,
    "": None,
}


#: core's parts (a module belongs to the longest one its name under ``psgdlab.core`` starts
#: with: a folder, or a module of core's own folder) -> the other parts it may import. Imports
#: under ``if TYPE_CHECKING:`` are names for the type checker, not arrows at run time, and are
#: left out of this rule (the one today: placement's annotations name the profile's Platform,
#: while the algorithms' builder calls placement); everything else, lazy imports included, counts.
CORE_PARTS: dict[str, frozenset[str]] = {
    # the bottom: the exceptions, strict loading and the one "did you mean", the one file writer
    "errors": frozenset(),
    "config": frozenset({"errors"}),
    "files": frozenset(),
    # the algorithm contract every executor uses
    "exchange": frozenset({"errors"}),
    "kernels": frozenset(),
    "replicas": frozenset(),
    "schedules": frozenset({"errors", "config"}),
    # fits and priors know nothing of the model; graphs nothing of the algorithms or the platform
    "stats": frozenset({"errors", "config"}),
    "graphs": frozenset({"errors", "config", "exchange"}),
    # the one placement rule: the algorithms' builder asks it how many workers a host holds
    "platform.placement": frozenset({"errors", "config"}),
    "algorithms": frozenset({"errors", "config", "exchange", "kernels", "graphs", "platform.placement"}),
    # what a cluster and a job cost: a profile fills what an algorithm's flags leave out
    "platform": frozenset({"errors", "config", "files", "exchange", "algorithms", "platform.placement"}),
    # what every executor writes and reads (a prediction's intervals come from the profile)
    "records": frozenset({"errors", "config", "files", "exchange", "platform"}),
    "convergence": frozenset({"errors", "config", "files", "stats", "algorithms", "records"}),
    # the tops: the shared flags, the oracle executor, the hypothesis strategies
    "flags": frozenset({"errors", "config", "schedules", "algorithms", "platform"}),
    "reference": frozenset({"errors", "exchange", "kernels", "replicas", "algorithms", "records"}),
    "_algorithm_strategies": frozenset({"errors", "algorithms"}),
    "strategies": frozenset({"errors", "graphs", "_algorithm_strategies"}),
    # the package itself: its exceptions only, so that importing any part of core stays cheap
    "": frozenset({"errors"}),
}


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    module: str


def layer_of(module: str) -> str | None:
    """The layer of a ``psgdlab`` module name, ``None`` for anything else."""
    for layer, package in PACKAGES.items():
        if layer != "cli" and (module == package or module.startswith(package + ".")):
            return layer
    if module == "psgdlab" or module.startswith("psgdlab."):
        return "cli"
    return None


def module_name(path: Path, layer: str) -> str:
    folder = ROOT / LAYERS[layer][0]
    parts = list(path.relative_to(folder).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([PACKAGES[layer], *parts])


def source_of(module: str) -> Path | None:
    """The source file of a ``psgdlab`` module; ``None`` for anything else (a name in a module)."""
    layer = layer_of(module)
    if layer is None:
        return None
    rest = module.removeprefix(PACKAGES[layer]).lstrip(".")
    base = ROOT / LAYERS[layer][0] / rest.replace(".", "/")
    return next((c for c in (base / "__init__.py", base.with_suffix(".py")) if c.is_file()), None)


def imports_of(path: Path, layer: str) -> list[Import]:
    """Every module ``path`` imports, wherever the statement stands."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = module_name(path, layer).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [Import(path, node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            # ``from package import module`` imports the module
            modules = {f"{name}.{alias.name}" for alias in node.names if source_of(f"{name}.{alias.name}")}
            found += [Import(path, node.lineno, m) for m in sorted(modules)] or [Import(path, node.lineno, name)]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append(Import(path, node.lineno, node.args[0].value))
    return found


def violations(layer: str) -> list[str]:
    folder, layers, third_party = LAYERS[layer]
    out = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for imp in sorted(imports_of(path, layer), key=lambda i: i.line):
            target = layer_of(imp.module)
            root = imp.module.split(".")[0]
            if target is not None:
                ok = target in layers
            else:
                ok = (
                    root in sys.stdlib_module_names or root == "__future__" or "*" in third_party or root in third_party
                )
            if not ok:
                out.append(f"{path.relative_to(ROOT)}:{imp.line}: {layer} imports {imp.module}")
    return out


@pytest.mark.parametrize("layer", list(LAYERS))
def test_imports_point_one_way(layer):
    bad = violations(layer)
    assert not bad, "imports against the grain:\n" + "\n".join(bad)


@pytest.mark.parametrize("module", ["psgdlab.emulate", "psgdlab.commands.emulate"])
def test_the_emulator_uses_the_models_never_the_runtime(module):
    """The emulation pipeline replays a trace on the models' replicas: it needs no transport."""
    path = source_of(module)
    assert path is not None
    bad = [f"{imp.line}: {imp.module}" for imp in imports_of(path, "cli") if layer_of(imp.module) == "runtime"]
    assert not bad, f"{module} imports the runtime: {bad}"
    assert any(layer_of(imp.module) == "models" for imp in imports_of(path, "cli"))


def runtime_part(module: str) -> str | None:
    """The part of the runtime (:data:`RUNTIME_PARTS`) that ``module`` belongs to; ``None`` outside it."""
    if layer_of(module) != "runtime":
        return None
    rest = module.removeprefix(PACKAGES["runtime"]).lstrip(".")
    return max((p for p in RUNTIME_PARTS if p == "" or rest == p or rest.startswith(p + ".")), key=len)


def _covers(allowed: str, part: str) -> bool:
    """Whether the allowed name ``allowed`` stands for ``part`` (itself or a part under it)."""
    return part == allowed or part.startswith(allowed + ".")


def runtime_violations() -> list[str]:
    out = []
    for path in sorted((ROOT / LAYERS["runtime"][0]).rglob("*.py")):
        part = runtime_part(module_name(path, "runtime"))
        assert part is not None
        allowed = RUNTIME_PARTS[part]
        if allowed is None:
            continue
        for imp in sorted(imports_of(path, "runtime"), key=lambda i: i.line):
            target = runtime_part(imp.module)
            if target is not None and target != part and not any(_covers(a, target) for a in allowed):
                out.append(f"{path.relative_to(ROOT)}:{imp.line}: runtime.{part or '__init__'} imports {imp.module}")
    return out


def test_the_runtime_parts_import_each_other_one_way():
    bad = runtime_violations()
    assert not bad, "imports against the grain inside the runtime:\n" + "\n".join(bad)


def check_no_circle(parts: dict[str, frozenset[str] | None]) -> None:
    """Part A may import part B, B may import C, ...: never back to A (so the imports that keep
    the rule cannot make a circle between parts). The entries (rule ``None``) may import every
    part; none of them is imported."""

    def allows(rule: frozenset[str] | None, other: str) -> bool:
        return rule is None or any(_covers(a, other) for a in rule)

    may = {part: {o for o in parts if o != part and allows(rule, o)} for part, rule in parts.items()}
    entries = {part for part, rule in parts.items() if rule is None}
    assert not any(entries & targets for part, targets in may.items() if part not in entries)
    done: set[str] = set()

    def visit(part: str, path: list[str]) -> None:
        for other in sorted(may[part] - entries):
            assert other not in path, "circle: " + " -> ".join([*path[path.index(other) :], other])
            if other not in done:
                visit(other, [*path, other])
        done.add(part)

    for part in sorted(set(parts) - entries):
        visit(part, [part])


def test_the_runtime_rule_has_no_circle():
    check_no_circle(dict(RUNTIME_PARTS))


def core_part(module: str) -> str | None:
    """The part of core (:data:`CORE_PARTS`) that ``module`` belongs to; ``None`` outside core,
    and for a part the rule does not name (a new module of core's own folder, say: it fails the
    scan until it is given a rule)."""
    if layer_of(module) != "core":
        return None
    rest = module.removeprefix(PACKAGES["core"]).lstrip(".")
    named = [p for p in CORE_PARTS if p == "" or rest == p or rest.startswith(p + ".")]
    part = max(named, key=len)
    return part if part or not rest else f"<{rest}>"


def type_checking_lines(tree: ast.AST) -> set[int]:
    """The lines inside every ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) block."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else None
            if name == "TYPE_CHECKING":
                lines |= {n.lineno for stmt in node.body for n in ast.walk(stmt) if hasattr(n, "lineno")}
    return lines


def core_violations() -> list[str]:
    out = []
    for path in sorted((ROOT / LAYERS["core"][0]).rglob("*.py")):
        part = core_part(module_name(path, "core"))
        assert part is not None
        allowed = CORE_PARTS.get(part)
        if allowed is None:
            out.append(f"{path.relative_to(ROOT)}: core part {part} has no rule in CORE_PARTS")
            continue
        typing_only = type_checking_lines(ast.parse(path.read_text(), filename=str(path)))
        for imp in sorted(imports_of(path, "core"), key=lambda i: i.line):
            target = core_part(imp.module)
            if imp.line in typing_only or target is None or target == part:
                continue
            if not any(_covers(a, target) for a in allowed):
                out.append(f"{path.relative_to(ROOT)}:{imp.line}: core.{part or '__init__'} imports {imp.module}")
    return out


def test_the_core_parts_import_each_other_one_way():
    bad = core_violations()
    assert not bad, "imports against the grain inside core:\n" + "\n".join(bad)


def test_the_core_rule_has_no_circle():
    check_no_circle(dict(CORE_PARTS))


def test_the_core_scan_finds_a_back_arrow(tmp_path, monkeypatch):
    """A graph module that imports the algorithms, a record that imports a convergence fit
    (lazily), and a module of core's folder without a rule are named; a type-only import is not."""
    for folder in ("core/graphs", "core/records", "core/convergence", "core/algorithms"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "core/convergence/fit.py").write_text("")
    (tmp_path / "core/graphs/topology.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from psgdlab.core.errors import require\n"
        "from psgdlab.core.algorithms import make_algorithm\n"
        "if TYPE_CHECKING:\n    from psgdlab.core.records import trace\n"
    )
    (tmp_path / "core/records/rows.py").write_text("def f():\n    from ..convergence import fit\n")
    (tmp_path / "core/gadget.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert [line.split(": ", 1)[1] for line in core_violations()] == [
        "core part <gadget> has no rule in CORE_PARTS",
        "core.graphs imports psgdlab.core.algorithms",
        "core.records imports psgdlab.core.convergence.fit",
    ]


def test_the_runtime_scan_finds_a_back_arrow(tmp_path, monkeypatch):
    """A loop module that imports a launcher, or the transport interface one of its
    implementations, is named (``from package import module`` included)."""
    for folder in ("runtime/loop", "runtime/launcher", "runtime/transports"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "runtime/launcher/launch.py").write_text("")
    (tmp_path / "runtime/transports/mpi.py").write_text("")
    (tmp_path / "runtime/loop/driver.py").write_text("from psgdlab.runtime.launcher import launch\n")
    (tmp_path / "runtime/transports/transport.py").write_text("def f():\n    from . import mpi\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert [line.split(": ", 1)[1] for line in runtime_violations()] == [
        "runtime.loop imports psgdlab.runtime.launcher.launch",
        "runtime.transports.transport imports psgdlab.runtime.transports.mpi",
    ]


def test_the_scan_sees_lazy_relative_and_dynamic_imports(tmp_path, monkeypatch):
    """The scanner itself: an import inside a function, a relative import and an
    ``importlib.import_module`` call are all found."""
    pkg = tmp_path / "sim"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "bad.py").write_text(
        "import importlib\n"
        "def f():\n    import torch\n"
        "from ..runtime import models\n"
        "importlib.import_module('psgdlab.analysis.figures')\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = violations("sim")
    assert [line.split(": ", 1)[1] for line in found] == [
        "sim imports torch",
        "sim imports psgdlab.runtime",
        "sim imports psgdlab.analysis.figures",
    ]


CHECK = """
import sys
import {module}
bad = sorted(m for m in {forbidden!r} if m in sys.modules)
print(",".join(bad))
"""


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("psgdlab.core", ("torch", "simpy", "mpi4py", "matplotlib", "hypothesis", "networkx")),
        ("psgdlab.core.algorithms", ("torch", "simpy", "mpi4py", "matplotlib")),
        ("psgdlab.core.reference", ("torch", "simpy", "mpi4py", "matplotlib")),
        ("psgdlab.core.graphs.topology", ("torch", "simpy", "mpi4py", "matplotlib", "networkx")),
        ("psgdlab.sim", ("torch", "mpi4py", "matplotlib")),
        ("psgdlab.analysis", ("torch", "simpy", "mpi4py")),
        ("psgdlab.cli", ("torch", "simpy", "mpi4py", "matplotlib")),
        # what the emulator and the trainer share: never the runtime or the simulator
        ("psgdlab.models", ("torch", "simpy", "mpi4py", "psgdlab.runtime", "psgdlab.sim")),
        ("psgdlab.models.recipes", ("torch", "simpy", "mpi4py", "psgdlab.runtime", "psgdlab.sim")),
        ("psgdlab.models.replicas", ("simpy", "mpi4py", "psgdlab.runtime", "psgdlab.sim")),
        ("psgdlab.models.scoring", ("simpy", "mpi4py", "psgdlab.runtime", "psgdlab.sim")),
        # the launcher of `psgdlab train` starts the ranks; only they need torch
        ("psgdlab.runtime.launcher.launch", ("torch", "simpy", "matplotlib")),
    ],
)
def test_import_does_not_load_heavy_dependencies(module, forbidden):
    out = subprocess.run(
        [sys.executable, "-c", CHECK.format(module=module, forbidden=forbidden)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "", f"importing {module} loaded {out.stdout.strip()}"
