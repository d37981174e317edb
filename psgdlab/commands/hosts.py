"""``psgdlab hosts``: run one command on each of H emulated hosts of this machine.

Each host is a network namespace with its own address, its link shaped to ``--nic-bandwidth``
(:mod:`psgdlab.runtime.launcher.netns`); the command runs once inside each, with ``{host}``, ``{hosts}``,
``{address}`` and ``{master}`` filled in (:mod:`psgdlab.runtime.launcher.hostrun`). It is how to start the
per-rank entry by hand on an emulated cluster, e.g. torchrun on two emulated nodes::

    psgdlab hosts --hosts 2 --nic-bandwidth 1Gbit/s -- python -m torch.distributed.run \\
        --nnodes {hosts} --node-rank {host} --nproc-per-node 2 --master-addr {master} \\
        --master-port 29500 -m psgdlab.runtime --algorithm hadpsgd --workers 4 --workers-per-node 2 \\
        --model least-squares --steps 50 --out runs/two-nodes

Needs root. Exit status: 0 when every host's command succeeded, 1 when one failed (named), 2 for
bad input.
"""

from __future__ import annotations

import argparse
from typing import Any

from psgdlab.commands import plain_text
from psgdlab.core.config import parse_rate
from psgdlab.core.flags import add_flags

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "hosts",
        help="run a command on each of H emulated hosts (torchrun, mpiexec proxies, the per-rank entry)",
        description=plain_text(__doc__ or "").split("\n\n")[0],
        epilog=plain_text(__doc__ or "").split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_flags(parser, "--hosts", "--nic-bandwidth", defaults={"--hosts": 2})
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND ...",
        help="the command each host runs; {host}, {hosts}, {address} and {master} are filled in",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from psgdlab.core.errors import require
    from psgdlab.runtime.config import MAX_HOSTS
    from psgdlab.runtime.launcher.hostrun import run_on_hosts

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    require(1 <= args.hosts <= MAX_HOSTS, "hosts", args.hosts, f"must be an integer from 1 to {MAX_HOSTS}")
    rate = None if args.nic_bandwidth is None else parse_rate(args.nic_bandwidth)
    run_on_hosts(command, hosts=args.hosts, rate_bytes_per_s=rate)
    return 0
