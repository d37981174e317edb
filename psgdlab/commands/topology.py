"""``psgdlab topology KIND --workers N``: spectral gap, rates and mixing time of a topology.

Examples::

    psgdlab topology fixed-ring --workers 16
    psgdlab topology hierarchical --workers 64 --workers-per-node 8 --inner random-ring --json
    psgdlab topology random-ring --workers 32 --plot gaps.png
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, Literal

from psgdlab.commands import print_json
from psgdlab.core.flags import add_old_spelling
from psgdlab.core.graphs.topology import INNER_KINDS, KINDS

__all__ = ["register", "run", "describe"]

MIXING_TOL = 1e-6


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "topology",
        help="spectral gap, consensus rate and mixing time of a topology",
        description=(
            "Print the spectral quantities of a topology: lambda2, rho, the spectral gap 1 - rho "
            "(of W for static kinds, of E[TT^T] for time-varying and random kinds), the period "
            f"and the mixing time to {MIXING_TOL:g}. Kinds: {', '.join(KINDS)}."
        ),
    )
    parser.add_argument("kind", metavar="KIND", help=f"one of: {', '.join(KINDS)}")
    parser.add_argument("--workers", type=int, required=True, metavar="N", help="number of workers (all GPUs)")
    per_node = parser.add_argument(
        "--workers-per-node",
        type=int,
        default=1,
        metavar="M",
        help="workers per node (hierarchical: size of a super-learner); default 1",
    )
    add_old_spelling(parser, "--gpus-per-node", per_node)
    parser.add_argument(
        "--inner",
        choices=INNER_KINDS,
        default=None,
        help=f"schedule of the super-learners (hierarchical only); default {INNER_KINDS[0]}",
    )
    parser.add_argument("--seed", type=int, default=0, metavar="K", help="seed of random-ring schedules")
    parser.add_argument("--json", action="store_true", help="print one JSON object on one line instead of a table")
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="FILE.png",
        help="also draw the spectral gap against the worker count for every kind (log-log)",
    )
    parser.add_argument(
        "--plot-max-workers",
        type=int,
        default=256,
        metavar="N",
        help="largest worker count on the plot (default 256; even counts from 4)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from psgdlab.core.errors import ConfigError

    if args.plot is not None:
        if args.plot.suffix.lower() != ".png":
            raise ConfigError(f"plot ({str(args.plot)!r}) must be a .png file")
        if args.plot.is_dir():  # said before the curves are computed, not after
            raise ConfigError(f"plot ({str(args.plot)!r}) is a directory; give a file name")
        folder = next((p for p in args.plot.absolute().parents if p.exists()), None)
        if folder is not None and not folder.is_dir():
            raise ConfigError(f"plot ({str(args.plot)!r}) cannot be written: {folder} is a file, not a directory")
        if args.plot_max_workers < 4:
            raise ConfigError(f"plot-max-workers ({args.plot_max_workers}) must be >= 4")
    topology, spectrum = describe(args.kind, args)
    if args.plot is not None:
        _write_plot(args.plot, topology, args.plot_max_workers)
        spectrum["plot"] = str(args.plot)
    if args.json:
        print_json(spectrum)
    else:
        print(_table(spectrum))
    return 0


def describe(kind: str, args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The topology ``kind`` of the flags ``args`` (``workers``, ``workers_per_node``, ``inner``,
    ``seed``) and its spectral numbers (``topology --json``'s object, without ``plot``)."""
    import warnings

    from psgdlab.core.graphs.spectral import mixing_time, topology_spectrum
    from psgdlab.core.graphs.topology import build_topology

    topology = build_topology(
        kind, args.workers, gpus_per_node=args.workers_per_node, seed=args.seed, inner=args.inner or "fixed-ring"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a zero gap is reported in the table itself
        spectrum = topology_spectrum(topology)
        steps = mixing_time(topology, MIXING_TOL)
    spectrum["inner"] = topology.inner if topology.kind == "hierarchical" else None
    spectrum["seed"] = topology.seed
    spectrum["mixing_time"] = None if math.isinf(steps) else int(steps)
    spectrum["mixing_tol"] = MIXING_TOL
    return topology, spectrum


def _table(s: dict[str, Any]) -> str:
    nodes = f"{s['nodes']} x {s['gpus_per_node']} GPU{'s' if s['gpus_per_node'] > 1 else ''}"
    kind = s["kind"] + (f" (inner {s['inner']})" if s["inner"] else "")
    which = "W (static)" if s["matrix"] == "W" else "E[TT^T] (time-varying: gaps of the expected gram matrix)"
    mixing = "never (gap 0)" if s["mixing_time"] is None else f"{s['mixing_time']} rounds to {s['mixing_tol']:g}"
    rows = [
        ("topology", kind),
        ("workers", str(s["workers"])),
        ("nodes", nodes),
        ("matrix", which),
        ("period", "random" if s["period"] is None else str(s["period"])),
        ("lambda2", _num(s["lambda2"])),
        ("lambda_min", _num(s["lambda_min"])),
        ("rho", _num(s["rho"])),
        ("spectral gap", f"{s['spectral_gap']:.6g}  (1 - rho)"),
        ("1 - lambda2", f"{s['gap_1_minus_lambda2']:.6g}"),
        ("consensus rate", f"{s['consensus_rate']:.6g}  (E C(theta T) <= rate * C(theta) per round)"),
        ("mixing time", mixing),
    ]
    if "plot" in s:
        rows.append(("plot", s["plot"]))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _num(x: float) -> str:
    """Six significant digits; eigen-solver noise below 1e-12 prints as 0."""
    return "0" if abs(x) < 1e-12 else f"{x:.6g}"


def _plot_counts(kind: str, max_workers: int, gpus_per_node: int) -> list[int]:
    """Even counts 4..max_workers that ``kind`` accepts, thinned to about six per octave."""
    from psgdlab.core.errors import TopologyError
    from psgdlab.core.graphs.topology import build_topology

    buckets: set[int] = set()
    kept = []
    for n in range(4, max_workers + 1, 2):
        try:
            build_topology(kind, n, gpus_per_node=gpus_per_node)
        except TopologyError:
            continue
        bucket = math.floor(6 * math.log2(n))
        if bucket not in buckets:
            buckets.add(bucket)
            kept.append(n)
    return kept


def _write_plot(path: Path, requested: Any, max_workers: int) -> None:
    """The spectral gap of every kind against the workers, the requested topology marked."""
    from psgdlab.analysis.figures import save_figure, spectral_gap_figure
    from psgdlab.core.graphs.spectral import spectral_gap_curve, topology_spectrum

    m_hier = requested.gpus_per_node if requested.kind == "hierarchical" and requested.gpus_per_node > 1 else 4
    inner: Literal["fixed-ring", "random-ring"] = requested.inner if requested.kind == "hierarchical" else "fixed-ring"
    curves = []
    for kind in KINDS:
        m = m_hier if kind == "hierarchical" else 1
        curve = spectral_gap_curve(
            kind, _plot_counts(kind, max_workers, m), gpus_per_node=m, inner=inner, seed=requested.seed
        )
        label = kind + (f" ({m}/node, {inner})" if kind == "hierarchical" else "")
        curves.append((label, curve, kind == requested.kind))
    gap = topology_spectrum(requested)["spectral_gap"]
    point = (requested.n_workers, gap, f"{requested.kind}, {requested.n_workers} workers: gap {gap:.3g}")
    save_figure(spectral_gap_figure(curves, point), path, dpi=120)
    print(f"wrote {path}", file=sys.stderr)
