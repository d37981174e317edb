"""``psgdlab compare PRED_DIR RUN_DIR``: predicted against measured, per (algorithm, workers)."""

from __future__ import annotations

import argparse

from psgdlab.commands import print_json
from psgdlab.core.flags import add_flags


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="compare a prediction (psgdlab predict) with a measured run (psgdlab train)",
        description=(
            "Compare every (algorithm, workers) case present in both run directories: step time, "
            "samples/s, communication and idle fractions, staleness (mean and total variation "
            "distance between histograms), as absolute and relative errors. Writes compare.json, "
            "report.md and figures into --out (default: RUN_DIR/compare)."
        ),
    )
    p.add_argument("pred_dir", metavar="PRED_DIR", help="run directory written by the simulator")
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory written by the runtime")
    p.add_argument("--out", metavar="DIR", help="where to write the report (default RUN_DIR/compare)")
    p.add_argument(
        "--force", action="store_true", help="replace the report --out holds (without it an earlier report is kept)"
    )
    add_flags(p, "--no-figures", "--json")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from psgdlab.analysis.compare import compare_dirs
    from psgdlab.analysis.report import markdown_report, write_report
    from psgdlab.core.records.results import document
    from psgdlab.core.records.rundir import open_run_dir

    result = compare_dirs(args.pred_dir, args.run_dir)
    out = Path(args.out) if args.out else Path(args.run_dir) / "compare"
    with open_run_dir(out, command="compare", force=args.force) as held:
        write_report(result, out, figures=not args.no_figures)
        held.commit()
    if args.json:
        print_json(document(result))
    else:
        print(markdown_report(result))
        print(f"report: {out / 'report.md'}")
    return 0
