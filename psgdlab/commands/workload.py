"""``psgdlab workload list`` and ``psgdlab workload show NAME``: the named workloads, and one as
a file ``--workload`` takes unchanged.

Examples::

    psgdlab workload list
    psgdlab workload show conformer-120m > model.toml    # then: psgdlab predict --workload model.toml
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from psgdlab.commands import print_json

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "workload",
        help="list the named workloads, or show one as a TOML file --workload takes",
        description=(
            "list: one line per named workload (parameters, FLOPs per sample, batch, what it is; the runtime's "
            "model preset that trains it, where there is one). show NAME: its [workload] table on stdout, every "
            "value with its source in a comment, as psgdlab predict --workload FILE.toml takes it unchanged "
            "(save it with a .toml suffix)."
        ),
    )
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = sub.add_parser("list", help="one line per workload")
    listing.add_argument("--json", action="store_true", help="a JSON list on one line, one object per workload")
    listing.set_defaults(func=run)
    show = sub.add_parser("show", help="a workload's TOML on stdout")
    show.add_argument("name", metavar="NAME", help="a workload of psgdlab workload list, or its runtime model")
    show.add_argument(
        "--json", action="store_true", help="the values and their comments as one JSON object on one line"
    )
    show.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from psgdlab.core.platform.workloads import WORKLOADS, workload, workload_toml

    if args.action == "show":
        w = workload(args.name)  # an unknown name: one line with the closest names
        if args.json:
            print_json({**dataclasses.asdict(w), "provenance": WORKLOADS[w.name].provenance})
        else:
            sys.stdout.write(workload_toml(args.name))
        return 0
    rows: list[dict[str, Any]] = [
        {
            "name": name,
            "model": entry.model,
            "n_params": entry.workload.n_params,
            "flops_per_sample": entry.workload.flops_per_sample,
            "batch_per_worker": entry.workload.batch_per_worker,
            "sample_unit": entry.workload.sample_unit,
            "description": entry.workload.description,
        }
        for name, entry in sorted(WORKLOADS.items())
    ]
    if args.json:
        print_json(rows)
        return 0
    for r in rows:
        model = f"--model {r['model']}" if r["model"] else ""
        print(
            f"{r['name']:<16} {r['n_params'] / 1e6:>6.1f}M params {r['flops_per_sample'] / 1e9:>7.3g} GFLOP/sample  "
            f"batch {r['batch_per_worker']:<5} {r['sample_unit']:<17} {model:<15} {r['description']}"
        )
    return 0
