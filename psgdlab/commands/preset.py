"""``psgdlab preset list`` and ``psgdlab preset show NAME``: the shipped clusters, and one as a
file ``--platform`` takes unchanged.

Examples::

    psgdlab preset list
    psgdlab preset show h100-sxm-ndr > mine.toml    # edit it, then: psgdlab predict --platform mine.toml
    psgdlab preset show a100-sxm-hdr --json         # the values, their comments and their sources
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from psgdlab.commands import print_json

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "preset",
        help="list the shipped cluster presets, or show one as a TOML file --platform takes",
        description=(
            "list: one line per shipped preset (hosts x devices, device, the link inside a host, the NIC, what "
            "it is). show NAME: the preset's TOML on stdout, every value with its source in a comment, as "
            "psgdlab predict --platform FILE.toml takes it unchanged (the same rows as --preset NAME); the "
            "tags in brackets are the sources of sim/presets/sources.toml, which --json resolves."
        ),
    )
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = sub.add_parser("list", help="one line per preset")
    listing.add_argument("--json", action="store_true", help="a JSON list on one line, one object per preset")
    listing.set_defaults(func=run)
    show = sub.add_parser("show", help="a preset's TOML on stdout")
    show.add_argument("name", metavar="NAME", help="a preset of psgdlab preset list")
    show.add_argument(
        "--json",
        action="store_true",
        help="the values, their comments and the sources they cite as one JSON object on one line",
    )
    show.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from psgdlab.core.platform.profile import Profile
    from psgdlab.sim.workload import preset_names, preset_path

    if args.action == "show":
        path = preset_path(args.name)  # an unknown name: one line with the closest names
        if args.json:
            print_json(_document(args.name, Profile.read(path), str(path)))
        else:
            sys.stdout.write(path.read_text(encoding="utf-8"))
        return 0
    rows = [_row(name, Profile.read(preset_path(name))) for name in preset_names()]
    if args.json:
        print_json(rows)
        return 0
    for r in rows:
        nic = f"{r['nic_gbit_per_s']:g} Gb/s" if r["hosts"] > 1 else "-"
        print(
            f"{r['name']:<22} {r['hosts']:>2} x {r['devices_per_host']:<2} {r['device']:<8} {r['inside_host']:<7} "
            f"nic {nic:<10} {r['description']}"
        )
    return 0


def _row(name: str, profile: Any) -> dict[str, Any]:
    """What ``preset list`` says of a preset."""
    p = profile.platform
    return {
        "name": name,
        "hosts": p.hosts,
        "devices_per_host": p.devices_per_host,
        "device": p.device,
        "inside_host": "NVLink" if p.nvlink is not None else "PCIe",
        "nic_gbit_per_s": p.nic.bandwidth_bytes_per_s * 8 / 1e9,
        "workload": profile.workload.name,
        "description": p.description,
    }


def _document(name: str, profile: Any, path: str) -> dict[str, Any]:
    """``preset show --json``: the tables, the comments by dotted path and the sources they cite."""
    import dataclasses

    from psgdlab.sim.workload import preset_sources, provenance_tags

    sources = preset_sources()
    cited = sorted({tag for text in profile.provenance.values() for tag in provenance_tags(text)})
    tables = {
        key: dataclasses.asdict(getattr(profile, key))
        for key in ("platform", "workload", "defaults", "uncertainty")
        if getattr(profile, key) is not None
    }
    return {
        "name": name,
        "path": path,
        **tables,
        "notes": list(profile.notes),
        "provenance": dict(profile.provenance),
        "sources": {tag: sources.get(tag) for tag in cited},
    }
