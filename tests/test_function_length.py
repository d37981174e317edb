"""No function or method of the package is over :data:`MAX_LINES` lines (issue 41: functions that
read as one idea). Ruff has no rule for lines per function (its complexity and statement-count
rules, C901 and PLR0915, are set in pyproject.toml), so this test reads every module of the
package's folders with :mod:`ast` and measures each ``def`` from its first line to its last
(decorators not counted; nested functions measured on their own as well as inside their parent).
Tests, benchmarks and examples may keep longer functions: they are not scanned.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: the folders of the package (``core/`` is ``psgdlab.core``, and so on: pyproject.toml's package-dir)
PACKAGE_FOLDERS = ("core", "sim", "runtime", "models", "analysis", "psgdlab")

MAX_LINES = 100


def function_lengths(source: str) -> dict[str, int]:
    """Each function's and method's length in lines (``def`` line to last line), by qualified name."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                assert child.end_lineno is not None
                lengths[name] = child.end_lineno - child.lineno + 1
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return lengths


def package_function_lengths() -> dict[str, int]:
    """Every function of the package's folders, as ``path::qualified name`` -> lines."""
    found: dict[str, int] = {}
    for folder in PACKAGE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for name, n in function_lengths(path.read_text(encoding="utf-8")).items():
                found[f"{rel}::{name}"] = n
    return found


def test_the_measure_counts_a_functions_lines_methods_and_nested_functions_included() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(5))
    source = f"@decorator\ndef f():\n{body}\n\nclass C:\n    def m(self):\n        def inner():\n            pass\n"
    assert function_lengths(source) == {"f": 6, "C.m": 3, "C.m.inner": 2}


def test_no_function_of_the_package_is_over_the_limit() -> None:
    lengths = package_function_lengths()
    assert len(lengths) > 1000, f"only {len(lengths)} functions found under {ROOT}: the scan missed the package"
    over = {name: n for name, n in lengths.items() if n > MAX_LINES}
    assert not over, f"functions over {MAX_LINES} lines (cut them into phases named for what they do): " + ", ".join(
        f"{name} ({n} lines)" for name, n in sorted(over.items(), key=lambda kv: -kv[1])
    )
