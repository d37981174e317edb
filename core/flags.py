"""The command-line flags that several commands share, defined once.

``psgdlab predict``, ``emulate``, ``train`` and ``validate`` describe the same things: an
algorithm and its hyperparameters, a number of workers, a model's batch and learning rate, a
straggler, a seed, an output directory. Each such flag is defined here, once: its name, type,
metavar and help (the help of algorithm flags is written from the registry, so a new algorithm or
variant shows up in every command without an edit). A command adds the flags it takes with
:func:`add_flags` and may give its own default; the meaning never changes between commands.

Examples
--------
>>> import argparse
>>> parser = argparse.ArgumentParser()
>>> add_flags(parser, "--algorithm", "--workers", "--period", many={"--workers"}, defaults={"--algorithm": "ssgd"})
>>> ns = parser.parse_args(["--workers", "2,4"])
>>> ns.algorithm, ns.workers, ns.period
('ssgd', (2, 4), None)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

from psgdlab.core.algorithms import ALGORITHMS, algorithm_parameters
from psgdlab.core.platform.failure import ON_FAILURE
from psgdlab.core.schedules import LR_SCHEDULES

__all__ = ["FLAGS", "OLD_SPELLINGS", "DefaultsHelpFormatter", "add_flags", "add_old_spelling", "int_list", "name_list"]


def int_list(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(1, 2, 4)`` (argparse type); an empty item (``"2,,"``) is refused.

    >>> int_list("1, 2,4")
    (1, 2, 4)
    >>> int_list("2,,")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: '2,,' has an empty item: give comma-separated integers, like 2,4,8
    """
    items = [x.strip() for x in text.split(",")]
    if not any(items):
        raise argparse.ArgumentTypeError(f"{text!r} needs at least one integer")
    if not all(items):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty item: give comma-separated integers, like 2,4,8")
    try:
        return tuple(int(x) for x in items)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def name_list(text: str) -> tuple[str, ...]:
    """``"ssgd,adpsgd"`` -> ``("ssgd", "adpsgd")`` (argparse type); an empty item is refused.

    >>> name_list("ssgd, adpsgd")
    ('ssgd', 'adpsgd')
    """
    items = tuple(x.strip() for x in text.split(","))
    if not any(items):
        raise argparse.ArgumentTypeError(f"{text!r} needs at least one name")
    if not all(items):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty item: give comma-separated names, like ssgd,adpsgd")
    return items


def _taking(parameter: str) -> str:
    """The registry's algorithms that take ``parameter``, comma-separated."""
    return ", ".join(name for name in ALGORITHMS if parameter in algorithm_parameters(name))


def _variants() -> str:
    return "; ".join(f"{name} {'|'.join(cls.variants)}" for name, cls in ALGORITHMS.items() if cls.variants)


#: flag -> argparse keywords (``type`` of a list flag is its element's; see :func:`add_flags`)
FLAGS: dict[str, dict[str, Any]] = {
    "--algorithm": dict(metavar="NAME", help=f"algorithm from the core registry: {', '.join(ALGORITHMS)}"),
    "--workers": dict(type=int, metavar="N", help="number of workers (one per GPU or process)"),
    "--workers-per-node": dict(
        type=int, metavar="M", help="workers (GPUs or CPU ranks) on each node (host); H-ADPSGD's super-learner size"
    ),
    "--period": dict(type=int, metavar="T", help=f"sync period in local steps ({_taking('period')})"),
    "--variant": dict(metavar="V", help=f"algorithm variant ({_variants()})"),
    "--momentum": dict(type=float, metavar="MU", help=f"local momentum ({_taking('momentum')})"),
    "--model": dict(metavar="NAME", help="model preset (its recipe gives the default batch, lr and schedule)"),
    "--data": dict(metavar="FILE", help="'synthetic' or an HDF5 corpus file (psgdlab data)"),
    "--steps": dict(type=int, metavar="S", help="local steps per worker"),
    "--epochs": dict(type=float, metavar="E", help="epochs over the training data"),
    "--batch": dict(type=int, metavar="B", help="minibatch per worker per step, in the model's sample unit"),
    "--lr": dict(type=float, metavar="LR", help="learning rate (the schedule's base rate)"),
    "--lr-schedule": dict(
        choices=tuple(LR_SCHEDULES),
        help="learning-rate schedule: " + "; ".join(f"{name} ({s.summary})" for name, s in LR_SCHEDULES.items()),
    ),
    "--lr-final": dict(type=float, metavar="LR", help="exp schedule: rate at the last step (default lr / 10)"),
    "--lsq-dim": dict(type=int, metavar="D", default=16, help="least-squares model: number of parameters"),
    "--lsq-samples": dict(
        type=int,
        metavar="N",
        default=256,
        help="least-squares model: rows of data per worker (an epoch is N / batch steps)",
    ),
    "--straggler": dict(
        metavar="SPEC",
        help="slow workers: RANK:FACTOR (RANK computes FACTOR times slower), random:PROB:FACTOR, "
        "periodic:RANK:EVERY:PAUSE_S (a pause of PAUSE_S seconds every EVERY steps); "
        "comma-separated",
    ),
    "--seed": dict(type=int, metavar="K", default=0, help="seed of data order, schedules and compute-time draws"),
    "--preset": dict(metavar="NAME", help="shipped platform+workload preset"),
    "--platform": dict(metavar="FILE.toml", help="platform+workload TOML file (a preset's format)"),
    "--out": dict(metavar="DIR", help="run directory (default runs/COMMAND-TIMESTAMP)"),
    "--json": dict(action="store_true", help="print one JSON object on one line instead of a table"),
    "--no-progress": dict(
        action="store_true", help="no progress on stderr (a bar is drawn only when stderr is a terminal)"
    ),
    "--no-figures": dict(action="store_true", help="draw no figures into the output directory"),
    "--force": dict(
        action="store_true",
        help="replace the run the output directory holds (everything in it is removed first); without it a "
        "directory holding another run is refused",
    ),
    "--target": dict(
        metavar="wer=PCT|loss=VALUE",
        help="the held-out metric to reach: each row adds its time to target (default: the workload's "
        "convergence profile's own target, where it has one)",
    ),
    "--convergence": dict(
        metavar="RUN_DIR[,RUN_DIR...]",
        help="take the convergence model from measurement: a reference run of the model (its summary.json "
        "has noise_scale and heldout_curve) or several psgdlab emulate run directories (default: the "
        "workload's shipped profile, where it has one)",
    ),
    "--jobs": dict(
        type=int,
        metavar="J",
        help="processes that simulate configurations side by side (the rows do not depend on it; "
        "default: the cores this process may run on)",
    ),
    "--checkpoint-every": dict(
        type=int, metavar="S", help="steps between checkpoints (0: at the end only; a restart then begins again)"
    ),
    "--fail": dict(
        action="append", metavar="RANK@SECONDS", help="worker RANK dies SECONDS after the start (repeatable)"
    ),
    "--failure-rate": dict(
        type=float,
        metavar="R",
        help="random failures, R per worker-hour (exponential lifetimes seeded by --seed)",
    ),
    "--hosts": dict(
        type=int,
        metavar="H",
        help="emulated hosts on this machine: one network namespace each, joined by a bridge "
        "(needs root); workers go on hosts in contiguous blocks of workers/H (ranks 0..k-1 on host 0, ...), "
        "a parameter server on host 0",
    ),
    "--on-failure": dict(
        choices=tuple(ON_FAILURE),
        help="when a worker dies: " + ", ".join(f"{name} ({what})" for name, what in ON_FAILURE.items()),
    ),
    "--max-restarts": dict(
        type=int, metavar="R", help="--on-failure restart: restarts before the run gives up (default 3)"
    ),
    "--nic-bandwidth": dict(
        metavar="RATE",
        help="each emulated host's link, shaped in both directions (tc tbf), like 1Gbit/s or 500Mbit/s "
        "(default: not shaped)",
    ),
}
_LIST_TYPES = {int: int_list, None: name_list}

#: the old spellings of shared flags, still accepted with a warning (:func:`add_old_spelling`)
OLD_SPELLINGS: dict[str, tuple[str, ...]] = {"--workers-per-node": ("--gpus-per-node",)}


class _OldSpelling(argparse.Action):
    """An old spelling of a flag: one warning line on stderr, then the new flag's action (or
    ``translate``'s values)."""

    def __init__(
        self,
        option_strings: list[str],
        dest: str,
        *,
        new: argparse.Action,
        translate: Callable[[Any], Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new, self.translate = new, translate

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        new = self.new.option_strings[-1]
        print(f"{parser.prog}: warning: {option} is deprecated, use {new} (the old spelling will go)", file=sys.stderr)
        if self.translate is None:
            self.new(parser, namespace, values, new)
        else:
            for key, value in self.translate(values).items():
                setattr(namespace, key, value)


def add_old_spelling(
    parser: _Parser,
    old: str,
    new: argparse.Action,
    *,
    type: Callable[[str], Any] | None = None,
    translate: Callable[[Any], Mapping[str, Any]] | None = None,
) -> None:
    """Accept ``old``, an earlier spelling of the flag ``new`` (the action ``add_argument``
    returned), with one warning line on stderr; hidden from ``--help``. The value is parsed as
    ``new``'s, unless ``type`` and ``translate`` say how to read the old one (another vocabulary:
    ``translate`` maps the parsed value to the namespace's attributes).

    >>> parser = argparse.ArgumentParser(prog="p")
    >>> add_old_spelling(parser, "--dim", parser.add_argument("--lsq-dim", type=int))
    >>> parser.parse_args(["--dim", "8"]).lsq_dim  # and on stderr: p: warning: --dim is deprecated, ...
    8
    """
    parser.add_argument(
        old,
        action=_OldSpelling,
        new=new,
        translate=translate,
        dest=new.dest,
        nargs=new.nargs if translate is None else None,
        const=new.const,
        type=type if translate is not None else new.type,
        choices=new.choices if translate is None else None,
        metavar=new.metavar,
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's formatter that appends ``(default: X)`` to a flag's help, except where there is
    no default to show (``None``, ``False``, or a help that states it already); a tuple or list
    default is written as the comma list the flag takes (``2,4``).

    >>> parser = argparse.ArgumentParser(prog="p", formatter_class=DefaultsHelpFormatter)
    >>> _ = parser.add_argument("--steps", type=int, default=80, help="steps")
    >>> _ = parser.add_argument("--period", type=int, help="period")
    >>> " ".join(parser.format_help().split()[-8:])
    '--steps STEPS steps (default: 80) --period PERIOD period'
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False) or "default" in text or action.default is argparse.SUPPRESS:
            return text
        if isinstance(action.default, (tuple, list)):
            shown = ",".join(map(str, action.default)).replace("%", "%%")
            return f"{text} (default: {shown})"
        return super()._get_help_string(action)


class _Parser(Protocol):
    """An :class:`argparse.ArgumentParser` or one of its argument groups."""

    def add_argument(self, *names: str, **kwargs: Any) -> Any: ...


def add_flags(
    parser: _Parser,
    *names: str,
    many: Collection[str] = (),
    required: Collection[str] = (),
    defaults: Mapping[str, Any] | None = None,
    helps: Mapping[str, str] | None = None,
    dests: Mapping[str, str] | None = None,
) -> None:
    """Add the shared flags ``names`` to ``parser``.

    Parameters
    ----------
    parser : argparse.ArgumentParser or argument group
    *names : str
        Flags of :data:`FLAGS`.
    many : collection of str
        Flags that take a comma-separated list here (``--workers 2,4,8``).
    required : collection of str
        Flags this command cannot do without.
    defaults : mapping
        The command's defaults (``None`` when not given: "not given" falls through to the
        model's recipe or the algorithm's default).
    helps : mapping
        Text appended to a flag's help in this command (what its default is here, say).
    dests : mapping
        Attribute names other than argparse's (``{"--platform": "platform_file"}``).
    """
    defaults = defaults or {}
    helps = helps or {}
    dests = dests or {}
    for name in names:
        if name not in FLAGS:
            raise KeyError(f"flag {name!r} is not a shared flag (known: {', '.join(FLAGS)})")
        spec = dict(FLAGS[name])
        if name in many:
            spec["type"] = _LIST_TYPES[spec.get("type")]
            spec["metavar"] = f"{spec.get('metavar', 'X')}[,...]"
        if name in defaults:
            spec["default"] = defaults[name]
        if name in helps:
            spec["help"] = f"{spec['help']}; {helps[name]}"
        if name in dests:
            spec["dest"] = dests[name]
        if name in required:
            spec["required"] = True
        action = parser.add_argument(name, **spec)
        for old in OLD_SPELLINGS.get(name, ()):
            add_old_spelling(parser, old, action)
