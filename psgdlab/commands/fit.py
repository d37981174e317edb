"""``psgdlab fit FIGURES.csv --platform BASE.toml --out FITTED.toml``: fit a platform's efficiencies
to published or measured figures, with leave-one-out and leave-one-group-out errors."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from psgdlab.commands import print_json, show_progress
from psgdlab.core.flags import DefaultsHelpFormatter, add_flags


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fit",
        help="fit a few efficiencies of a platform to a table of speedups or step times, cross-validated",
        description=(
            "Fit a few positive values of a platform profile (its efficiencies, a jitter; named by dotted "
            "path) to a table of published or measured figures (CSV: algorithm, workers, batch, period, and "
            "speedup or step_time_s), each predicted by the simulator. Every fitted value has a log-normal "
            "prior at the base profile's value (the spec-sheet figure or a typical efficiency), so what the "
            "figures cannot pin down stays near its prior and is reported as unpinned. Reports, beside the "
            "in-sample error, the leave-one-out and leave-one-group-out errors (groups: each worker count, "
            "algorithm, batch and period), each value's uncertainty and the flat directions of the fit, and "
            "writes the fitted profile with an [uncertainty] table that psgdlab predict turns into intervals."
        ),
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("figures", metavar="FIGURES.csv", help="the figures table (sim/presets/fit/*.csv is an example)")
    src = p.add_mutually_exclusive_group(required=True)
    add_flags(src, "--preset", "--platform", helps={"--platform": "the base profile: spec-sheet values and priors"})
    p.add_argument(
        "--fit",
        metavar="PATH[:SD]",
        action="append",
        required=True,
        help="a value to fit, by dotted path (platform.compute_efficiency, platform.pcie.efficiency, ...), "
        "with the spread of its prior's logarithm (default 0.7: a factor of two at one sd); repeat the flag",
    )
    p.add_argument("--out", required=True, metavar="FITTED.toml", help="the fitted profile to write (atomically)")
    add_flags(p, "--no-progress")
    p.add_argument("--no-loo", action="store_true", help="skip leave-one-out (leave-one-group-out still runs)")
    p.add_argument(
        "--noise",
        type=float,
        default=0.02,
        metavar="SIGMA",
        help="relative spread of the figures (published to two decimals, run-to-run noise)",
    )
    add_flags(
        p,
        "--json",
        helps={
            "--json": "print the fit as one JSON object (schema_version, out, values, log_sd, prior, prior_log_sd, "
            "unpinned, flat_directions, noise, the errors and per figure its label, given, fitted and errors)"
        },
    )
    p.set_defaults(func=run)


def _parameters(items: list[str]) -> dict[str, float]:
    from psgdlab.core.errors import ConfigError

    out: dict[str, float] = {}
    for item in items:
        path, _, sd = item.partition(":")
        try:
            spread = float(sd) if sd else 0.7
        except ValueError:
            raise ConfigError(f"--fit ({item}) must look like PATH or PATH:SD with SD a number") from None
        if not spread > 0:
            raise ConfigError(f"--fit ({item}): the prior's spread ({spread}) must be > 0")
        out[path.strip()] = spread
    return out


def run(args: argparse.Namespace) -> int:
    from psgdlab.core.records.results import document
    from psgdlab.sim.fit import FitResult, fit_profile, read_figures, write_fitted
    from psgdlab.sim.workload import load_config

    base = load_config(path=args.platform) if args.platform else load_config(preset=args.preset)
    figures = read_figures(args.figures)
    parameters = _parameters(args.fit)
    from tqdm import tqdm

    n_groups = sum(len({str(getattr(f, g)) for f in figures}) for g in ("workers", "algorithm", "batch", "period"))
    total = (0 if args.no_loo else len(figures)) + n_groups
    with tqdm(
        total=total,
        desc="cross-validation",
        unit="refit",
        file=sys.stderr,
        delay=1.0,
        leave=False,
        disable=not show_progress(args),
    ) as bar:
        profile, report = fit_profile(
            base, figures, parameters, loo=not args.no_loo, noise=args.noise, progress=lambda s: bar.update(1)
        )
    result = FitResult.of(report, figures)
    path = write_fitted(profile, result, args.out, head=(f"Fitted by `psgdlab fit {args.figures}`.",))
    result = dataclasses.replace(result, out=str(path))
    if args.json:
        print_json(document(result.to_json()))
    else:
        print(f"wrote {path}")
        print("\n".join(result.describe()))
    return 0
