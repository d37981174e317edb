"""psgdlab's Python API: the commands' pipelines called from Python (a notebook, a script).

Each function takes the keyword names of its command's flags (``--workers-per-node`` is
``workers_per_node``) with the same values: a comma list as a string (``"8,64"``) or a Python list
(``[8, 64]``), a flag without a value (``--force``) as a bool. The keywords are checked by the
command's own parser actions (:func:`flags_namespace`: one mapping, no second parser), so a bad
value is the same one-line :class:`~psgdlab.core.errors.ConfigError` the command exits 2 with.

Unlike the commands, the functions default to one process (``jobs=1``), no progress bar and no
files: a run directory is written only when ``out=`` names one.

Examples
--------
>>> import psgdlab
>>> rows = psgdlab.predict(algorithm="ssgd,adpsgd", workers=[4, 8], steps=40)
>>> [(r["algorithm"], r["workers"]) for r in rows]
[('ssgd', 4), ('ssgd', 8), ('adpsgd', 4), ('adpsgd', 8)]
>>> rows[0]["speedup"] > 1
True
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from psgdlab.analysis.load import Run
    from psgdlab.core.graphs.topology import Topology
    from psgdlab.core.records.rows import PredictionRow
    from psgdlab.core.records.summaries import PlanAnswer
    from psgdlab.sim.workload import SimConfig

__all__ = [
    "predict",
    "plan",
    "load_platform",
    "topology",
    "TopologyInfo",
    "read_run",
    "flags_namespace",
    "API_DEFAULTS",
    "NOT_KEYWORDS",
]

#: the API's defaults where they differ from the command's: one process, no bar
API_DEFAULTS: dict[str, Any] = {"jobs": 1, "no_progress": True}

#: flags of a command that its function does not take: ``topology --plot`` draws every kind's
#: gap curve into a file (the function returns the numbers and the matrix)
NOT_KEYWORDS: dict[str, tuple[str, ...]] = {"topology": ("plot", "plot_max_workers")}


def flags_namespace(
    command: str, flags: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
) -> argparse.Namespace:
    """The namespace ``psgdlab COMMAND`` would parse, from keyword values named as its flags.

    Every keyword is the ``dest`` of one of the command's flags and its value goes through that
    flag's own ``type`` and ``choices`` as the command line's text would (a list is joined with
    commas first); ``None`` leaves the command's default. The command's ``--json`` is not a
    keyword (the functions return typed results). ``defaults`` replace the command's defaults of
    the flags it has (others are ignored).

    >>> ns = flags_namespace("predict", {"workers": [8, 64], "algorithm": "ssgd"})
    >>> ns.workers, ns.algorithm, ns.jobs
    ((8, 64), ('ssgd',), None)
    >>> flags_namespace("predict", {"workers": "8,x"})
    Traceback (most recent call last):
    ...
    psgdlab.core.errors.ConfigError: workers ('8,x'): '8,x' is not a comma-separated list of integers
    >>> flags_namespace("predict", {"wrokers": 8})
    Traceback (most recent call last):
    ...
    TypeError: predict() got an unexpected keyword argument 'wrokers'
    """
    from psgdlab.cli import command_parser
    from psgdlab.core.errors import ConfigError

    parser = command_parser(command)
    # the flags as --help lists them (an old spelling, hidden, shares its new flag's dest)
    actions = {a.dest: a for a in parser._actions if a.dest not in ("help", "json") and a.help != argparse.SUPPRESS}
    ns = parser.parse_args([*_required_placeholders(parser, flags)])
    for key, value in (defaults or {}).items():
        if key in actions:
            setattr(ns, key, value)
    for key, value in flags.items():
        action = actions.get(key)
        if action is None:
            raise TypeError(f"{command}() got an unexpected keyword argument {key!r}")
        if value is None:
            continue
        try:
            setattr(ns, key, _convert(action, value))
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise ConfigError(f"{key} ({value!r}): {' '.join(str(exc).split())}") from None
    return ns


def _required_placeholders(parser: argparse.ArgumentParser, flags: Mapping[str, Any]) -> list[str]:
    """Command-line text for the required flags and arguments among ``flags`` (argparse would
    refuse to parse without them; their values are set again by :func:`flags_namespace`)."""
    out: list[str] = []
    for a in parser._actions:
        if a.required and flags.get(a.dest) is not None:
            value = flags[a.dest]
            out += [*a.option_strings[:1], ",".join(map(str, value)) if _is_list(value) else str(value)]
    return out


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str)


def _convert(action: argparse.Action, value: Any) -> Any:
    """``value`` as ``action`` parses it from the command line."""
    if action.nargs == 0:  # store_true, store_false, count
        if not isinstance(value, bool):
            raise ValueError(f"must be True or False (the flag {action.option_strings[0]} takes no value)")
        return value if action.const is not False else not value
    items = [str(v) for v in value] if _is_list(value) else [str(value)]
    convert = action.type if callable(action.type) else str
    repeated = isinstance(action, argparse._AppendAction)  # a repeatable flag: one value per repetition
    converted = [convert(v) for v in items] if repeated else [convert(",".join(items))]
    if action.choices is not None:
        for v in converted:
            if v not in action.choices:
                raise ValueError(f"must be one of {', '.join(map(str, action.choices))}")
    return converted if repeated else converted[0]


def _namespace(command: str, given: Mapping[str, Any]) -> argparse.Namespace:
    return flags_namespace(command, given, API_DEFAULTS)


def predict(
    *,
    algorithm: str | Sequence[str] | None = None,
    workers: str | int | Sequence[int] | None = None,
    preset: str | None = None,
    platform: str | Path | None = None,
    workload: str | Path | None = None,
    workers_per_node: int | None = None,
    workers_per_host: int | None = None,
    batch: int | None = None,
    period: int | None = None,
    variant: str | None = None,
    steps: int | None = None,
    straggler: str | None = None,
    seed: int | None = None,
    target: str | None = None,
    convergence: str | Sequence[str] | None = None,
    fail: str | Sequence[str] | None = None,
    failure_rate: float | None = None,
    on_failure: str | None = None,
    checkpoint_every: int | None = None,
    failure_draws: int | None = None,
    jobs: int | None = None,
    out: str | Path | None = None,
    force: bool | None = None,
    no_figures: bool | None = None,
    no_progress: bool | None = None,
    yes: bool | None = None,
) -> list[PredictionRow]:
    """Predict step time, speedup, time to train or to a target and staleness with the
    simulator: ``psgdlab predict`` (``psgdlab predict --help`` describes every keyword, which is
    its flag's name).

    Parameters
    ----------
    algorithm : str or list of str
        Algorithms (``"ssgd,hadpsgd"`` or ``["ssgd", "hadpsgd"]``; default: the platform file's).
    workers : str, int or list of int
        Worker counts (default: the platform file's).
    preset, platform : str
        A shipped preset's name, or a platform TOML file (one of them; default: the default preset).
    workload : str
        Another workload on the same platform: a name or a TOML file.
    workers_per_node, workers_per_host, batch, period, variant, steps, straggler, seed : optional
        As the flags of the same names.
    target, convergence : str, optional
        The held-out metric to reach (``"wer=20"``) and the convergence model's run directories.
    fail, failure_rate, on_failure, checkpoint_every, failure_draws : optional
        Failures to price, as the flags.
    jobs : int, optional
        Processes that simulate side by side (default 1 here; the rows do not depend on it).
    out : str or Path, optional
        Write a run directory there (the command's files; default: write nothing).
    force, no_figures, no_progress, yes : bool, optional
        As the flags (the progress bar is off here unless ``no_progress=False``).

    Returns
    -------
    list of PredictionRow
        One per (algorithm, workers), in the command's order: the rows ``predict --json``
        prints, each a read-only mapping over its JSON keys (``row["speedup"]``) and a typed
        object (``row.speedup``).

    Examples
    --------
    >>> import psgdlab
    >>> rows = psgdlab.predict(algorithm=["ssgd", "hadpsgd"], workers=[8, 64], steps=40)
    >>> [(r["algorithm"], r["workers"]) for r in rows]
    [('ssgd', 8), ('ssgd', 64), ('hadpsgd', 8), ('hadpsgd', 64)]
    >>> all(r["speedup"] > 1 for r in rows)
    True
    """
    given = dict(locals())
    from psgdlab.commands.predict import resolve, simulate, write_into

    args = _namespace("predict", given)
    req = resolve(args)
    predictions = simulate(args, req)
    if args.out is not None:
        from psgdlab.core.records.rundir import open_run_dir

        with open_run_dir(args.out, command="predict", force=args.force) as held:
            write_into(held, args, req, predictions)
            held.commit()
    return [p.row for p in predictions]


def plan(
    *,
    preset: str | None = None,
    platform: str | Path | None = None,
    workload: str | Path | None = None,
    target: str | None = None,
    convergence: str | Sequence[str] | None = None,
    algorithm: str | Sequence[str] | None = None,
    batches: str | Sequence[int] | None = None,
    periods: str | Sequence[int] | None = None,
    steps: int | None = None,
    max_gpus: int | None = None,
    deadline: float | None = None,
    budget_gpu_hours: float | None = None,
    objective: str | None = None,
    seed: int | None = None,
    jobs: int | None = None,
    out: str | Path | None = None,
    force: bool | None = None,
    no_figures: bool | None = None,
) -> PlanAnswer:
    """Search algorithms, workers, batches and periods for the Pareto front of time to a target
    against GPU-hours and recommend one: ``psgdlab plan`` (its ``--help`` describes every
    keyword, which is its flag's name).

    Returns
    -------
    PlanAnswer
        What ``plan --json`` prints (``run_dir`` is ``None`` unless ``out=`` is given), a
        read-only mapping over its JSON keys and a typed object.

    Examples
    --------
    >>> import psgdlab
    >>> answer = psgdlab.plan(algorithm="ssgd", batches=[64], periods=[5], max_gpus=8, steps=20)
    >>> answer["recommended"]["algorithm"], answer.run_dir is None
    ('ssgd', True)
    """
    given = dict(locals())
    from psgdlab.commands.plan import plan_into, prepare

    t0 = time.perf_counter()
    args = _namespace("plan", given)
    config, profile, target_, cands, steps_ = prepare(args)
    if args.out is None:
        return plan_into(None, args, config, profile, target_, cands, steps_, t0)
    from psgdlab.core.records.rundir import open_run_dir

    with open_run_dir(args.out, command="plan", force=args.force) as held:
        return plan_into(held, args, config, profile, target_, cands, steps_, t0)


def load_platform(preset_or_path: str | Path) -> SimConfig:
    """A platform with its workload and defaults: a shipped preset's name (``psgdlab preset
    list``) or a platform TOML file (an existing file, or a name ending in ``.toml``).

    Examples
    --------
    >>> import psgdlab
    >>> config = psgdlab.load_platform("interspeech2019-v100")
    >>> config.platform.devices_per_host, config.workload.name
    (8, 'bilstm-43m')
    """
    from psgdlab.sim.workload import load_config

    text = str(preset_or_path)
    if isinstance(preset_or_path, Path) or text.endswith(".toml") or Path(text).is_file():
        return load_config(path=text)
    return load_config(preset=text)


class TopologyInfo(Mapping[str, Any]):
    """A topology with its mixing matrix and spectral numbers (what ``psgdlab topology --json``
    prints), read as a mapping over those numbers.

    Attributes
    ----------
    topology : Topology
        The built topology (:func:`psgdlab.core.graphs.topology.build_topology`).
    mixing_matrix : numpy.ndarray
        ``W`` of a static kind; ``E[T T^T]`` of a time-varying or random one (whose
        spectrum the gap is of).
    spectral_gap : float
        ``1 - rho`` of that matrix.
    """

    __slots__ = ("_numbers", "mixing_matrix", "topology")

    def __init__(self, topology: Topology, mixing_matrix: Any, numbers: Mapping[str, Any]) -> None:
        self.topology = topology
        self.mixing_matrix = mixing_matrix
        self._numbers = dict(numbers)

    @property
    def spectral_gap(self) -> float:
        return float(self._numbers["spectral_gap"])

    def __getitem__(self, key: str) -> Any:
        return self._numbers[key]

    def __iter__(self) -> Any:
        return iter(self._numbers)

    def __len__(self) -> int:
        return len(self._numbers)

    def __repr__(self) -> str:
        return (
            f"TopologyInfo({self._numbers['kind']!r}, workers={self._numbers['workers']}, gap={self.spectral_gap:.6g})"
        )


def topology(
    kind: str, *, workers: int, workers_per_node: int | None = None, inner: str | None = None, seed: int | None = None
) -> TopologyInfo:
    """Build a topology and its spectral numbers: ``psgdlab topology KIND --workers N``.

    Examples
    --------
    >>> import psgdlab
    >>> ring = psgdlab.topology("ring", workers=8)
    >>> ring.mixing_matrix.shape, round(ring.spectral_gap, 4), ring["mixing_time"]
    ((8, 8), 0.1953, 32)
    """
    from psgdlab.commands.topology import describe

    given = {"kind": kind, "workers": workers, "workers_per_node": workers_per_node, "inner": inner, "seed": seed}
    args = flags_namespace("topology", given)
    built, numbers = describe(args.kind, args)
    return TopologyInfo(built, _mixing_matrix(built, numbers["matrix"]), numbers)


def _mixing_matrix(built: Topology, which: str) -> Any:
    if which == "W":
        return built.matrix(0)
    from psgdlab.core.graphs.spectral import expected_gram

    return expected_gram(built)


def read_run(path: str | Path, *, trace: bool = True) -> Run:
    """A run directory of one case, typed: its summary (``run.case``; ``run.summary`` as one flat
    object), resolved config (``run.config``), trace (``run.trace``, a numpy record array;
    ``trace=False`` leaves it unread) and environment (``run.env``).

    Examples
    --------
    >>> import tempfile, psgdlab
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = psgdlab.predict(algorithm="ssgd", workers=4, steps=20, out=d + "/p", no_figures=True)
    ...     run = psgdlab.read_run(d + "/p/runs/ssgd-w4")
    ...     run.case.workers, run.trace is not None
    (4, True)
    """
    from psgdlab.analysis.load import load_run

    return load_run(path, with_trace=trace)
