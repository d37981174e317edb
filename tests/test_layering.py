"""Dependencies point one way: core <- {sim, models} <- runtime <- psgdlab (CLI, pipelines);
core <- analysis <- psgdlab.

Two checks:

- a static one: every import statement of every module of the package (lazy ones inside
  functions included, relative ones resolved, ``importlib.import_module("...")`` with a literal
  name too) is read from the source with :mod:`ast` and checked against the layer's rule below;
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
        if layer == "cli" and any(
            p in ("core", "sim", "models", "runtime", "analysis", "tests")
            for p in path.relative_to(ROOT / folder).parts[:1]
        ):
            continue  # development symlinks psgdlab/<part> -> ../<part>
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
        ("psgdlab.core.topology", ("torch", "simpy", "mpi4py", "matplotlib", "networkx")),
        ("psgdlab.sim", ("torch", "mpi4py", "matplotlib")),
        ("psgdlab.cli", ("torch", "simpy", "mpi4py", "matplotlib")),
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
