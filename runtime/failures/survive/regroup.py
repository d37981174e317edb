"""Collectives over a group that survivors form alone (``--on-failure continue``).

The process groups of a run are made at start-up, collectively by every rank of the world
(:func:`psgdlab.runtime.transports.channels.open_channels`); ``dist.new_group`` cannot make another once a
rank has died. When a member of an H-ADPSGD node dies, the node's survivors still sum their
gradients every step, over a group the world never made. :class:`SurvivorGroups` makes it from
the survivors alone: a gloo process group (``torch.distributed.ProcessGroupGloo``) whose
rendezvous is a ``torch.distributed.FileStore`` in the run directory -- a file on the file system
every rank writes already (the membership lives beside it), which no rank owns, so any member may
be the one that dies next. One store and one process group per tuple of ranks: a membership only
shrinks, so a tuple is formed once, and every member that asks for it gets the same group, on any
host (gloo picks its interface as the default group did: ``GLOO_SOCKET_IFNAME``, else the host
name).

Forming the group waits for every member to join it, within ``timeout_s``; a member that died
before joining fails it then, as a member that dies during a collective makes it fail (gloo:
the connection ends; a stopped process: the timeout). The caller (the driver) runs both on a
thread it can leave as soon as the member is given up (:meth:`psgdlab.runtime.loop.driver._Worker._unless_lost`).
"""

from __future__ import annotations

import datetime
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["SurvivorGroups", "GROUPS_DIR"]

#: under the run's membership directory: one rendezvous file per group of survivors
GROUPS_DIR = "groups"


class SurvivorGroups:
    """The groups of survivors ``rank`` belongs to, made on demand (module docstring).

    Parameters
    ----------
    root : Path
        The directory of the rendezvous files (``OUT/membership/groups``), on a file system
        every member reads and writes.
    rank : int
        This rank (in the world's numbering).
    timeout_s : float
        Forming a group, and each of its collectives, fails after this long.
    """

    def __init__(self, root: Path, *, rank: int, timeout_s: float) -> None:
        self.root = root
        self.rank = rank
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self._groups: dict[tuple[int, ...], Any] = {}
        self._lock = threading.Lock()

    def _group(self, group: tuple[int, ...]) -> Any:
        """The process group of ``group`` (formed on first use: every member must ask for it)."""
        with self._lock:
            pg = self._groups.get(group)
        if pg is None:  # formed outside the lock: a caller that left a forming group may form another
            self.root.mkdir(parents=True, exist_ok=True)
            store = dist.FileStore(str(self.root / ("g" + "-".join(map(str, group)))), len(group))
            pg = dist.ProcessGroupGloo(store, group.index(self.rank), len(group), self.timeout)
            with self._lock:
                pg = self._groups.setdefault(group, pg)
        return pg

    def allreduce_sum(self, tensor: torch.Tensor, group: Sequence[int]) -> None:
        """Replace ``tensor`` (on the CPU) by its sum over ``group``, which holds this rank."""
        key = tuple(group)
        if len(key) > 1:
            self._group(key).allreduce([tensor]).wait()

    def close(self) -> None:
        """Drop this rank's groups (their connections close with them)."""
        with self._lock:
            self._groups.clear()

    def remove(self) -> None:
        """Remove the rendezvous files of every group (at the end of the run, once every survivor
        is past its last collective; a store's own clean-up skips a file that is gone)."""
        shutil.rmtree(self.root, ignore_errors=True)
