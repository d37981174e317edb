"""The documentation site builds with ``mkdocs build --strict``, its generated pages say what the
code says, and every Python example of the docs and the README runs."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: pages of docs/ that are not part of the site (mkdocs.yml's exclude_docs)
NOT_ON_SITE = ("journal.md", "fsdd/")

pytestmark = pytest.mark.skipif(
    not (ROOT / "mkdocs.yml").is_file(), reason="an installed copy without the repository's docs"
)


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _site_pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if not any(str(p.relative_to(DOCS)).startswith(x) for x in NOT_ON_SITE))


def test_site_builds_strict(tmp_path):
    """A broken link, a page outside the navigation or a docstring griffe cannot read fails it."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "psgdlab predict" in cli and "--workers" in cli
    api = (site / "reference" / "api" / "index.html").read_text()
    assert "build_topology" in api and "spectral_gap" in api
    assert (site / "sources" / "index.html").is_file()
    assert not (site / "journal" / "index.html").exists()


def test_cli_reference_is_every_commands_help(monkeypatch):
    """The generated page holds each command's --help exactly as `psgdlab COMMAND --help` prints it."""
    from psgdlab import cli

    hooks = _hooks()
    page = hooks.cli_reference()
    monkeypatch.setenv("COLUMNS", str(hooks.HELP_COLUMNS))
    for name in cli.COMMANDS:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            cli.build_parser().parse_args([name, "--help"])
        assert out.getvalue().rstrip() in page, name
    assert "## `psgdlab preset show`" in page  # a subcommand's own help


def test_sources_page_lists_every_tag():
    with (ROOT / "sim" / "presets" / "sources.toml").open("rb") as stream:
        sources = tomllib.load(stream)
    page = _hooks().sources_page()
    for tag, source in sources.items():
        assert f"| `{tag}` |" in page
        assert source["citation"].replace("|", "\\|") in page


def test_sphinx_roles_render_as_plain_code():
    plain_roles = _hooks().plain_roles
    assert plain_roles("a :class:<code>~x.Y</code>, :math:<code>n^2</code>") == "a <code>x.Y</code>, <code>n^2</code>"
    assert plain_roles("time:<code>3</code> and <code>:func:</code>") == "time:<code>3</code> and <code>:func:</code>"


def test_import_layout_maps_every_subpackage(tmp_path):
    layout = _hooks().import_layout(ROOT, tmp_path / "layout")
    assert (layout / "psgdlab" / "core" / "topology.py").resolve() == ROOT / "core" / "topology.py"
    assert (layout / "psgdlab" / "cli.py").resolve() == ROOT / "psgdlab" / "cli.py"
    assert (layout / "psgdlab" / "runtime").resolve() == ROOT / "runtime"


def _python_blocks() -> list[tuple[str, str]]:
    blocks = []
    for page in [*_site_pages(), ROOT / "README.md"]:
        text = page.read_text()
        for i, match in enumerate(re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)):
            blocks.append((f"{page.relative_to(ROOT)}[{i}]", match.group(1)))
    return blocks


#: the run directory results.md's example reads, made by a short predict before it runs
PREDICT_RUN = "runs/predict-20260101-120000"


@pytest.mark.parametrize(("where", "code"), _python_blocks(), ids=[w for w, _ in _python_blocks()])
def test_python_examples_run(where, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if PREDICT_RUN in code:
        from psgdlab.cli import main

        assert main(["predict", "--algorithm", "ssgd", "--workers", "1,2", "--steps", "20", "--out", PREDICT_RUN]) == 0
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code, where, "exec"), {"__name__": "__docs_example__"})


# ----- the README ---------------------------------------------------------------------------------

README = ROOT / "README.md"


def _readme_commands() -> list[str]:
    """Every command line of the README's bash blocks (continuations joined, comments dropped)."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", README.read_text(), re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def test_readme_is_one_screenful_with_its_picture_and_the_ci_command():
    text = README.read_text()
    assert len(text.splitlines()) < 200
    ci_pytest_line = next(line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line)
    assert ci_pytest_line in text  # .ci/run runs the Quick start's command verbatim
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


#: README commands run here for real (cheap); every other psgdlab command is parsed with the CLI's
#: own parser (each takes seconds to minutes, or root: predict and plan simulate a sweep, train
#: starts ranks, validate trains and needs root for --hosts), and the rest are other programs
#: (pip, torchrun, ruff, mypy through .ci/typecheck.py, mkdocs) that the CI runs or that need a
#: launcher
RUN_FOR_REAL = ("psgdlab topology",)


@pytest.mark.parametrize("command", _readme_commands())
def test_readme_command(command, tmp_path, monkeypatch):
    import shlex

    from psgdlab.cli import build_parser, main

    argv = shlex.split(command)
    if argv[0] == "sudo":
        argv = argv[1:]
    if not argv[0].endswith("psgdlab"):
        pytest.skip(f"not a psgdlab command: {argv[0]}")
    monkeypatch.chdir(tmp_path)
    if command.startswith(RUN_FOR_REAL):
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(argv[1:]) == 0
    else:
        args = build_parser().parse_args(argv[1:])
        assert args.func is not None
