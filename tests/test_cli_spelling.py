"""One spelling per concept across the commands: old spellings accepted with one warning line,
-v/-q before or after the subcommand, plain-text help, one --json format."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from psgdlab.cli import build_parser, main


def _parsers(parser: argparse.ArgumentParser, name: str = "psgdlab"):
    """Every parser of the command line, nested subcommands too, with its command words."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, p in action.choices.items():
                yield from _parsers(p, f"{name} {sub}")


PARSERS = dict(_parsers(build_parser()))

#: the arguments a command cannot parse without
REQUIRED = {
    "psgdlab topology": ["ring", "--workers", "8"],
    "psgdlab validate": ["--out", "v"],
    "psgdlab emulate": ["--algorithm", "ssgd", "--workers", "2"],
}

#: every old spelling: (command, old argv, the new argv that means the same)
OLD = [
    ("psgdlab topology", ["--gpus-per-node", "2"], ["--workers-per-node", "2"]),
    ("psgdlab predict", ["--gpus-per-node", "2"], ["--workers-per-node", "2"]),
    ("psgdlab emulate", ["--gpus-per-node", "2"], ["--workers-per-node", "2"]),
    ("psgdlab train", ["--gpus-per-node", "2"], ["--workers-per-node", "2"]),
    ("psgdlab calibrate", ["--devices", "8"], ["--workers-per-node", "8"]),
    ("psgdlab validate", ["--dim", "2000"], ["--lsq-dim", "2000"]),
    ("psgdlab validate", ["--algorithms", "ssgd,adpsgd-random"], ["--algorithm", "ssgd,adpsgd", "--variant", "random"]),
    ("psgdlab validate", ["--algorithms", "adpsgd"], ["--algorithm", "adpsgd", "--variant", "fixed"]),
]


def _old_spellings() -> set[tuple[str, str]]:
    return {
        (name, a.option_strings[0])
        for name, p in PARSERS.items()
        for a in p._actions
        if a.option_strings and a.help == argparse.SUPPRESS and a.dest != "version"
    }


def test_every_old_spelling_is_tested():
    assert _old_spellings() == {(c, old[0]) for c, old, _ in OLD}


@pytest.mark.parametrize("command, old, new", OLD, ids=[f"{c} {o[0]} {o[1]}" for c, o, _ in OLD])
def test_an_old_spelling_means_the_new_one_with_one_warning(command, old, new, capsys):
    words = command.split()[1:]
    parsed_old = build_parser().parse_args([*words, *REQUIRED.get(command, []), *old])
    err = capsys.readouterr().err
    parsed_new = build_parser().parse_args([*words, *REQUIRED.get(command, []), *new])
    assert vars(parsed_old) == vars(parsed_new)
    assert err.splitlines() == [f"{command}: warning: {old[0]} is deprecated, use {new[0]} (the old spelling will go)"]
    assert capsys.readouterr().err == ""


def test_validate_old_cases_become_the_same_cases():
    from psgdlab.validate.plan import ALGORITHM_CASES, cases_of, cases_to_flags

    for case in ALGORITHM_CASES:
        flags = cases_to_flags([case])
        assert cases_of(flags["algorithm"], flags["variant"]) == (case,)
    assert cases_of(*cases_to_flags(list(ALGORITHM_CASES)).values()) == tuple(ALGORITHM_CASES)


@pytest.mark.parametrize(
    "argv",
    [
        ["-v", "topology", "ring", "--workers", "8"],
        ["topology", "ring", "--workers", "8", "-v"],
        ["topology", "-v", "ring", "--workers", "8"],
        ["-q", "preset", "list", "-v"],
        ["preset", "list", "-vq"],
    ],
)
def test_verbosity_before_or_after_the_subcommand(argv, capsys):
    args = build_parser().parse_args(argv)
    assert (args.verbose, args.quiet) == ((1, 0) if "-q" not in argv and "-vq" not in argv else (1, 1))
    assert main(argv) == 0
    assert capsys.readouterr().out


def test_quiet_and_verbose_set_the_log_level():
    import logging

    from psgdlab.cli import log_level

    args = build_parser().parse_args(["-v", "topology", "ring", "--workers", "8", "-qqq"])
    assert log_level(args.verbose, args.quiet) == logging.CRITICAL
    args = build_parser().parse_args(["topology", "ring", "--workers", "8", "-vv"])
    assert log_level(args.verbose, args.quiet) == logging.DEBUG


#: what plain help text has none of: reST roles and literals, Python reprs of defaults
NOT_PLAIN = [
    (re.compile(r"``"), "a reST literal"),
    (re.compile(r":(func|mod|class|math|data|meth|attr|ref|doc):"), "a reST role"),
    (re.compile(r"\(default: [(\[{]"), "a Python repr of a default"),
    (re.compile(r"==SUPPRESS=="), "argparse's SUPPRESS"),
    (re.compile(r"<(function|class|built-in)"), "a Python object repr"),
    (re.compile(r"default: '"), "a quoted Python string default"),
]


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_help_is_plain_text(name):
    text = PARSERS[name].format_help()
    found = [
        f"{what}: ...{text[max(m.start() - 30, 0) : m.end() + 30]!r}..."
        for r, what in NOT_PLAIN
        for m in r.finditer(text)
    ]
    assert not found, f"{name} --help: " + "; ".join(found)


@pytest.mark.parametrize(
    "argv",
    [
        ["topology", "ring", "--workers", "8", "--json"],
        ["preset", "list", "--json"],
        ["preset", "show", "interspeech2019-v100", "--json"],
        ["workload", "list", "--json"],
    ],
)
def test_json_is_one_document_on_one_line(argv, capsys):
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.endswith("\n")
    json.loads(out)


def test_every_json_flag_says_one_line():
    helps = {name: a.help for name, p in PARSERS.items() for a in p._actions if "--json" in a.option_strings}
    assert helps and all("one line" in (h or "") for h in helps.values()), helps


def test_the_ranks_progress_bar_follows_the_rule(monkeypatch):
    from psgdlab.runtime.train import _progress_bar

    monkeypatch.setenv("PSGDLAB_PROGRESS", "1")
    assert _progress_bar(10, 0) is not None
    monkeypatch.setenv("PSGDLAB_PROGRESS", "0")
    assert _progress_bar(10, 0) is None


def test_train_without_figures_or_progress(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("PSGDLAB_PROGRESS", "1")  # a bar even off a terminal, unless --no-progress
    out = tmp_path / "t"
    argv = ["train", "--model", "least-squares", "--steps", "5", "--workers", "2", "--out", str(out)]
    assert main([*argv, "--no-figures", "--no-progress", "--json"]) == 0
    captured = capfd.readouterr()
    assert "step/s" not in captured.err and "it/s" not in captured.err
    assert json.loads(captured.out)["workers"] == 2
    assert not (out / "loss.png").exists() and (out / "summary.json").is_file()
    import os

    assert os.environ["PSGDLAB_PROGRESS"] == "1"  # put back after the run
