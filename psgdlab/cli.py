"""The ``psgdlab`` command: one entry point, one thin subcommand module per job.

Exit status: 0 success, 2 bad input (usage, config, topology or matrix error), 1 a run that failed.
Errors are printed as one line on stderr (``psgdlab: error: ...``); logs go to stderr.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import sys

__all__ = ["main", "build_parser"]

# subcommand name -> module under psgdlab.commands (registered in this order in --help)
COMMANDS: dict[str, str] = {
    "topology": "topology",
    "predict": "predict",
    "plan": "plan",
    "preset": "preset",
    "workload": "workload",
    "emulate": "emulate",
    "train": "train",
    "hosts": "hosts",
    "data": "data",
    "calibrate": "calibrate",
    "fit": "fit",
    "compare": "compare",
    "validate": "validate",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="psgdlab",
        description=(
            "Parallel SGD testbed for speech acoustic models: predict step time, speedup and "
            "staleness with a simulator, property-test mixing matrices, and run real training "
            "on torch.distributed or MPI."
        ),
    )
    from psgdlab import __version__

    parser.add_argument("--version", action="version", version=f"psgdlab {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output on stderr (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMANDS.values():
        full = f"psgdlab.commands.{module_name}"
        if importlib.util.find_spec(full) is None:
            continue  # a subcommand not built yet
        importlib.import_module(full).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    from psgdlab.core.errors import RunInterrupted, TestbedError

    try:
        return int(args.func(args) or 0)
    except RunInterrupted as exc:  # a stop the ranks agreed on: the shell's status for the signal
        print(f"psgdlab: {_one_line(exc)}", file=sys.stderr)
        return exc.exit_status
    except (TestbedError, ValueError, FileNotFoundError) as exc:
        # ValueError-like errors are bad input (exit 2); RuntimeError-like are failed runs (exit 1)
        status = 2 if isinstance(exc, (ValueError, FileNotFoundError)) else 1
        print(f"psgdlab: error: {_one_line(exc)}", file=sys.stderr)
        return status
    except KeyboardInterrupt:
        print("psgdlab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`psgdlab ... --json | head`): not a failure of ours; point stdout at
        # /dev/null so the interpreter's final flush does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
