"""mypy over psgdlab as setuptools maps it: ``psgdlab.core`` from ``core/``, and so on.

mypy names a module after the folders it sits in, so on its own it would see ``core/errors.py``
as ``core.errors``, never as ``psgdlab.core.errors``: it has no counterpart of setuptools'
``package-dir`` (python/mypy#10564 asks for one). This hands mypy every module of the packages listed in
``[tool.setuptools] packages`` (those in :data:`UNCHECKED` aside) with its import name, read from
``[tool.setuptools.package-dir]``; mypy then checks the source files themselves and reports each
error at its source path (``core/errors.py:78: error: ...``). The options are mypy's own, from
``[tool.mypy]``; arguments go to mypy as options (``--no-incremental``, ``--strict``, ...), and
what it checks is always the whole mapping.

Usage: ``.venv/bin/python .ci/typecheck.py [MYPY OPTIONS]``; the exit status is mypy's (0 clean,
1 type errors, 2 a blocking error). mypy is pinned by the ``test`` extra: the build entry points
used here (``process_options``, ``run_build``, ``BuildSource``) are mypy's internals, not its
documented ``mypy.api``, whose command line cannot name a file's module.
"""

from __future__ import annotations

import os
import sys
import time
import tomllib
from pathlib import Path

from mypy import util
from mypy.fscache import FileSystemCache
from mypy.main import process_options, run_build
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parent.parent
#: packages installed but not type-checked: the tests are not annotated
UNCHECKED = ("psgdlab.tests",)


def mapped_modules(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, Path]:
    """Import name -> source file, for every module of the checked packages, from the mapping.

    A package's folder is its own ``package-dir`` entry, else its parent's folder and its last
    name (as setuptools resolves it); a module belongs to the package of its folder.
    """
    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["setuptools"]
    package_dir: dict[str, str] = config["package-dir"]

    def folder(package: str) -> Path:
        if package in package_dir:
            return ROOT / package_dir[package]
        parent, _, name = package.rpartition(".")
        return folder(parent) / name

    modules: dict[str, Path] = {}
    for package in config["packages"]:
        if package.startswith(UNCHECKED):
            continue
        for path in sorted(folder(package).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            modules[name] = path
    return modules


def main(argv: list[str]) -> int:
    start = time.time()
    os.chdir(ROOT)  # mypy reads pyproject.toml here, and reports the paths relative to it
    modules = mapped_modules()
    fscache = FileSystemCache()
    # mypy's options from its configuration and ``argv``; it is given this file as its target
    # (it wants one), and the modules of the mapping are what it checks
    _, options = process_options([*argv, __file__], fscache=fscache)
    sources = [BuildSource(str(path.relative_to(ROOT)), name, None, str(ROOT)) for name, path in modules.items()]
    _, messages, blockers = run_build(sources, options, fscache, start, sys.stdout, sys.stderr)
    n_errors, n_notes, n_files = util.count_stats(messages)
    formatter = util.FancyFormatter(sys.stdout, sys.stderr, options.hide_error_codes)
    if n_errors:
        print(
            formatter.format_error(n_errors, n_files, len(sources), blockers=blockers, use_color=options.color_output)
        )
    else:
        print(formatter.format_success(len(sources), options.color_output))
    if messages and n_notes < len(messages):
        return 2 if blockers else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
