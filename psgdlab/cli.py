"""The ``psgdlab`` command: one entry point, one thin subcommand module per job.

Exit status: 0 success, 2 bad input (usage, config, topology or matrix error), 1 a run that failed,
130 interrupted (SIGINT). Errors are printed as one line on stderr (``psgdlab: error: ...``;
a usage error: ``psgdlab COMMAND: error: ...``); logs go to stderr.

The last line of defence (:func:`main`) turns what a user's input or the machine can raise
beyond psgdlab's own errors into one line as well, the traceback behind ``-v``: an
:class:`OSError` (permission, is-a-directory, exists, not-a-directory, a full disk; exit 2 for a
path the user gave, 1 for the machine's failure), :class:`RecursionError` (a deeply nested
file), :class:`OverflowError` (a value too large), :class:`MemoryError`, and a corrupt archive
(``zipfile``, ``zlib``). Anything else is a bug of psgdlab and keeps its traceback.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import importlib.util
import logging
import os
import sys
import traceback
import zipfile
import zlib
from typing import Any, NoReturn

__all__ = ["main", "build_parser", "command_parser"]

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


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one line (exit 2), with a pointer to ``--help``
    in place of the usage text; subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


class CommandParser(_Parser):
    """The parser of a command and of its subcommands (argparse makes a subparser of its
    parent's class): ``-v/-q`` taken after the subcommand too
    (``psgdlab topology ring --workers 8 -v``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _add_verbosity(self)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="psgdlab",
        description=(
            "Parallel SGD testbed for speech acoustic models: predict step time, speedup and "
            "staleness with a simulator, property-test mixing matrices, and run real training "
            "on torch.distributed or MPI."
        ),
    )
    from psgdlab import __version__

    parser.add_argument("--version", action="version", version=f"psgdlab {__version__}")
    _add_verbosity(parser, default=0)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    for module_name in COMMANDS.values():
        full = f"psgdlab.commands.{module_name}"
        if importlib.util.find_spec(full) is None:
            continue  # a subcommand not built yet
        importlib.import_module(full).register(sub)
    return parser


def _add_verbosity(parser: argparse.ArgumentParser, default: int | str = argparse.SUPPRESS) -> None:
    """``-v/--verbose`` and ``-q/--quiet`` on ``parser``. Below the top (every
    :class:`CommandParser`) a flag not given leaves the top's count (``argparse.SUPPRESS``)."""
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=default,
        help="more log output on stderr (-vv for debug), and the traceback above an error",
    )
    parser.add_argument(
        "-q", "--quiet", action="count", default=default, help="less log output on stderr (-qq: errors only)"
    )


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser of one subcommand (``psgdlab NAME``'s flags), built as :func:`build_parser`
    builds it, without importing the other commands (:func:`psgdlab.api.flags_namespace`)."""
    if name not in COMMANDS:
        raise KeyError(f"no command {name!r} (known: {', '.join(COMMANDS)})")
    sub = _Parser(prog="psgdlab").add_subparsers(dest="command", parser_class=CommandParser)
    importlib.import_module(f"psgdlab.commands.{COMMANDS[name]}").register(sub)
    return sub.choices[name]


def log_level(verbose: int, quiet: int) -> int:
    """The log level of ``-v`` and ``-q`` counts: WARNING, one step per flag, DEBUG to CRITICAL.

    >>> [logging.getLevelName(log_level(v, q)) for v, q in ((0, 0), (2, 0), (5, 0), (0, 1), (0, 4), (1, 1))]
    ['WARNING', 'DEBUG', 'DEBUG', 'ERROR', 'CRITICAL', 'WARNING']
    """
    return min(max(logging.WARNING - 10 * verbose + 10 * quiet, logging.DEBUG), logging.CRITICAL)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = log_level(args.verbose, args.quiet)
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
        return _fail(exc, status, args.verbose)
    except KeyboardInterrupt:
        print("psgdlab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`psgdlab ... --json | head`): not a failure of ours; point stdout at
        # /dev/null so the interpreter's final flush does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        return _fail(exc, 1 if exc.errno in _MACHINE_ERRNOS else 2, args.verbose, _os_error(exc))
    except RecursionError as exc:
        return _fail(exc, 2, args.verbose, "input nested too deeply to read (Python's recursion limit)")
    except OverflowError as exc:
        return _fail(exc, 2, args.verbose, f"a value is too large ({_one_line(exc)})")
    except MemoryError as exc:
        return _fail(exc, 2, args.verbose, f"not enough memory for this input ({_one_line(exc)}); use smaller sizes")
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        return _fail(exc, 2, args.verbose, f"a corrupt or truncated archive ({_one_line(exc)})")


#: errno values of the machine's failure (exit 1), not of a path the user gave (exit 2)
_MACHINE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.ENOMEM, errno.EMFILE, errno.ENFILE})


def _fail(exc: BaseException, status: int, verbose: int, text: str | None = None) -> int:
    """Print ``psgdlab: error: TEXT`` (one line; the traceback above it with ``-v``); returns ``status``."""
    if verbose:
        traceback.print_exception(exc, file=sys.stderr)
    print(f"psgdlab: error: {text if text is not None else _one_line(exc)}", file=sys.stderr)
    return status


def _os_error(exc: OSError) -> str:
    """``PATH: No space left on device`` (both paths of a rename), else the error's own words."""
    reason = exc.strerror or _one_line(exc)
    names = [str(n) for n in (exc.filename, exc.filename2) if n is not None]
    where = " -> ".join(names)
    return " ".join(f"{where}: {reason}".split()) if where else _one_line(exc)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
