"""The package as setuptools maps it: every package folder is installed, and the type check
(``.ci/typecheck.py``) names each module as the import system finds it."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]


def _typecheck():
    spec = importlib.util.spec_from_file_location("typecheck", ROOT / ".ci" / "typecheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_package_folder_is_a_listed_package():
    """A folder with an ``__init__.py`` under a mapped folder that is missing from
    ``[tool.setuptools] packages`` would be neither installed nor type-checked (the tests aside:
    only the helpers they import from each other are installed)."""
    listed = set(SETUPTOOLS["packages"])
    missing = []
    for package, folder in SETUPTOOLS["package-dir"].items():
        if package.startswith("psgdlab.tests"):
            continue
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            name = ".".join([package, *parts])
            if name not in listed and not any(p.startswith(".") or p == "__pycache__" for p in parts):
                missing.append(name)
    assert not missing, f"package folders missing from [tool.setuptools] packages: {sorted(missing)}"


def test_the_type_check_names_every_module_as_it_is_imported():
    modules = _typecheck().mapped_modules()
    assert modules["psgdlab.core.errors"] == ROOT / "core" / "errors.py"
    assert modules["psgdlab.runtime.loop.driver"] == ROOT / "runtime" / "loop" / "driver.py"
    assert not any(name.startswith("psgdlab.tests") for name in modules)
    wrong = {}
    for name, path in modules.items():
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None or Path(spec.origin).resolve() != path.resolve():
            wrong[name] = None if spec is None else spec.origin
    assert not wrong, f"named otherwise than imported: {wrong}"
    # every module file of the checked folders is checked
    checked = {p.resolve() for p in modules.values()}
    for package, folder in SETUPTOOLS["package-dir"].items():
        if package.startswith("psgdlab.tests"):
            continue
        for path in (ROOT / folder).rglob("*.py"):
            inner = any(f != folder and (ROOT / f) in path.parents for f in SETUPTOOLS["package-dir"].values())
            if not inner:
                assert path.resolve() in checked, f"{path.relative_to(ROOT)} is not type-checked"
