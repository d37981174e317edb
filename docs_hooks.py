"""mkdocs hooks of the documentation site: pages generated at build time from the code.

- ``reference/cli.md``: every command's ``--help``, read from the parsers the commands register
  (:data:`psgdlab.cli.COMMANDS`, each module's ``register``), so the page follows every flag
  change without a committed copy to keep current;
- ``sources.md``: every source tag of the presets, from ``sim/presets/sources.toml``.

Generated at build time (not committed and checked by a test) because the CLI is still changing:
a committed page would need a regeneration commit with every flag change, and a build-time page
cannot go stale. ``mkdocs.yml`` names this file under ``hooks``. :func:`cli_reference` and
:func:`sources_page` are plain functions, so the tests call them without mkdocs.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import shutil
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from psgdlab.cli import CommandParser

ROOT = Path(__file__).resolve().parent
SOURCES_TOML = ROOT / "sim" / "presets" / "sources.toml"
#: where :func:`import_layout` puts the package as Python imports it (git-ignored; mkdocs.yml's
#: mkdocstrings ``paths`` names it)
LAYOUT = ROOT / ".cache" / "api-layout"
#: the width the help texts are wrapped at on the page (argparse reads $COLUMNS): what the
#: theme's code blocks show without scrolling at a common window width
HELP_COLUMNS = 80


class _Recorder(CommandParser):
    """A command's argument parser (``-v/-q`` and all, :class:`psgdlab.cli.CommandParser`) that
    remembers the subcommand parsers made on it, in order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.children: list[tuple[str, _Recorder]] = []

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("parser_class", _Recorder)
        action = super().add_subparsers(**kwargs)
        add_parser = action.add_parser

        def recording_add_parser(name: str, **parser_kwargs: Any) -> Any:
            child = add_parser(name, **parser_kwargs)
            self.children.append((name, child))
            return child

        action.add_parser = recording_add_parser
        return action


@contextlib.contextmanager
def _columns(width: int) -> Iterator[None]:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def _walk(prefix: str, parser: _Recorder, level: int) -> Iterator[str]:
    yield f"{'#' * level} `{prefix}`\n\n```text\n{parser.format_help().rstrip()}\n```\n\n"
    for name, child in parser.children:
        yield from _walk(f"{prefix} {name}", child, level + 1)


def cli_reference() -> str:
    """The CLI reference page: ``psgdlab --help``, then every command's (and subcommand's) help."""
    from psgdlab import cli

    with _columns(HELP_COLUMNS):
        parts = [
            "# Command-line reference\n\n",
            "Generated from the parsers when the site is built: each command's `--help`, as "
            "`psgdlab COMMAND --help` prints it.\n\n",
            f"## `psgdlab`\n\n```text\n{cli.build_parser().format_help().rstrip()}\n```\n\n",
        ]
        for module_name in cli.COMMANDS.values():
            root = _Recorder(prog="psgdlab")
            importlib.import_module(f"psgdlab.commands.{module_name}").register(root.add_subparsers())
            for name, parser in root.children:
                parts.extend(_walk(f"psgdlab {name}", parser, 2))
    return "".join(parts)


def sources_page(path: Path = SOURCES_TOML) -> str:
    """The sources page: every tag of ``sources.toml`` with its kind, citation and address."""
    with path.open("rb") as stream:
        sources: dict[str, dict[str, str]] = tomllib.load(stream)
    kinds: dict[str, list[str]] = {}
    for tag, source in sources.items():
        kinds.setdefault(source["kind"], []).append(tag)
    parts = [
        "# Sources of the presets\n\n",
        "Every value of a preset (`sim/presets/*.toml`, `sim/presets/fit/*.toml`) and of a named "
        "workload carries a tag in brackets at the head of its comment: `[S000 §5.1]` is source "
        "`S000`, section 5.1. This page lists every tag, generated from `sim/presets/sources.toml` "
        "when the site is built (a test holds every tag of the presets to resolving there). Kinds: "
        "*publication* (a paper), *spec-sheet* (a vendor's data sheet or a standard), *measurement* "
        "(figures measured and published by someone, with what measured them), *derived* (computed "
        "from cited figures), *assumption* (an inference where the sources are silent).\n\n",
        "`psgdlab preset show NAME` prints a preset with its tags.\n\n",
    ]
    for kind in ("publication", "spec-sheet", "measurement", "derived", "assumption"):
        tags = kinds.pop(kind, [])
        if tags:
            parts.append(f"## {kind.capitalize()}\n\n| tag | source |\n|---|---|\n")
            parts.extend(_source_row(tag, sources[tag]) for tag in tags)
            parts.append("\n")
    for kind, tags in kinds.items():  # a kind added to sources.toml later still shows
        parts.append(f"## {kind}\n\n| tag | source |\n|---|---|\n")
        parts.extend(_source_row(tag, sources[tag]) for tag in tags)
        parts.append("\n")
    return "".join(parts)


def _source_row(tag: str, source: dict[str, str]) -> str:
    citation = source["citation"].replace("|", "\\|")
    url = source.get("url", "")
    link = f" <{url}>" if url else ""
    return f"| `{tag}` | {citation}{link} |\n"


def import_layout(root: Path = ROOT, layout: Path = LAYOUT) -> Path:
    """A folder of symbolic links that holds the package as Python imports it.

    ``[tool.setuptools.package-dir]`` maps folders of the repository to subpackages of
    ``psgdlab`` (``core/`` is ``psgdlab.core``); mkdocstrings' loader (griffe) reads a package from
    the folders under a search path and cannot follow that mapping. The layout gives it
    ``psgdlab/`` with a link to every entry of ``root/psgdlab`` and one per mapped subpackage,
    made in a fresh folder and renamed into place, so two builds at once do not see a half-made
    one. Returns ``layout``.
    """
    with (root / "pyproject.toml").open("rb") as stream:
        package_dir: dict[str, str] = tomllib.load(stream)["tool"]["setuptools"]["package-dir"]
    layout.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=".api-layout-", dir=layout.parent))
    package = fresh / "psgdlab"
    package.mkdir()
    for entry in (root / package_dir["psgdlab"]).iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for name, folder in package_dir.items():
        if name != "psgdlab":
            (package / name.removeprefix("psgdlab.")).symlink_to(root / folder)
    old = layout.with_name(f"{fresh.name}-old")
    with contextlib.suppress(FileNotFoundError):
        layout.rename(old)
    fresh.rename(layout)
    shutil.rmtree(old, ignore_errors=True)
    return layout


def on_startup(command: str, dirty: bool) -> None:
    """mkdocs hook: make the import layout mkdocstrings reads the API from, before any plugin
    reads its configuration (mkdocstrings resolves its ``paths`` then)."""
    import_layout()


#: a Sphinx role of the docstrings as Markdown renders it: the role's name as text before the code
_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj|math):<code>~?")


def plain_roles(html: str) -> str:
    """The docstrings' Sphinx roles (``:class:`X```, ``:math:`x```) as plain code: numpydoc
    docstrings write them for Sphinx, and Markdown leaves the role's name in front of the code.

    >>> plain_roles('see :class:<code>~a.B</code> and :math:<code>x^2</code>')
    'see <code>a.B</code> and <code>x^2</code>'
    """
    return _ROLE.sub("<code>", html)


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """mkdocs hook: the API pages' Sphinx roles as plain code."""
    return plain_roles(html)


#: generated pages: path under docs/ -> the function that writes it
GENERATED = {"reference/cli.md": cli_reference, "sources.md": sources_page}


def on_files(files: Any, config: Any) -> Any:
    """mkdocs hook: add the generated pages to the site's files."""
    from mkdocs.structure.files import File

    for src_uri, make in GENERATED.items():
        files.append(File.generated(config, src_uri, content=make()))
    return files
