"""One membership that every survivor agrees on, kept in the run directory, owned by no rank.

When gossip workers die, the survivors must go on over the same set of workers: two survivors that
next exchange must never hold different memberships (no split brain), and nothing they need may
live in one rank alone (rank 0 may be the one that died). The run directory is on a file system
every rank writes already (checkpoints, traces), so the agreement lives there, as a chain of
*epochs*::

    OUT/membership/epoch00000001.json   {"epoch": 1, "alive": [...], "removed": [...], "by": r, ...}
    OUT/membership/epoch00000002.json   ...

Epoch 0 is every rank, and is never written. Epoch ``k + 1`` is epoch ``k`` without the ranks a
survivor found dead. It is created only once: the proposer writes it under a name of its own
(temporary, fsynced) and then hard-links it to the epoch's name, which fails with ``EEXIST`` when
another survivor created that epoch first (``link(2)`` is atomic, on NFS too). The loser reads the
winner's epoch; where its own dead ranks are not all in it, it proposes them as the next epoch.
So the epochs form one chain that every rank reads alike, each epoch whole or absent, and a
membership only ever shrinks.

A rank that finds itself outside the newest epoch has been given up for dead (it stopped answering
within the deadline): it must stop, and :meth:`Agreement.refresh` raises :class:`Removed`. Ranks
compare epochs when they exchange: the one behind refreshes first, so both exchange under the same
membership.
"""

from __future__ import annotations

import errno
import json
import os
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from psgdlab.core.errors import TransportError
from psgdlab.core.records.trace import temporary_path

__all__ = ["Agreement", "Epoch", "Removed", "MEMBERSHIP_DIR"]

MEMBERSHIP_DIR = "membership"
_EPOCH = re.compile(r"^epoch(\d{8})\.json$")


class Removed(TransportError):
    """This rank is not in the newest membership: the survivors gave it up for dead."""


@dataclass(frozen=True)
class Epoch:
    """One membership: ``alive`` after ``removed`` were found dead by rank ``by``.

    ``time_s`` is the proposer's clock (seconds since the epoch of ``time.time``) when it wrote the
    epoch; ``step`` its local step then; ``detection_s`` how long it waited on the dead ranks
    before it gave them up. ``switch_step``: the first step whose schedule is rebuilt over
    ``alive`` (None: at once); until then the members go on with the previous schedule, less the
    dead (a schedule whose both sides block, D-PSGD's gossip, must change at one step on every
    member).
    """

    epoch: int
    alive: tuple[int, ...]
    removed: tuple[int, ...] = ()
    by: int | None = None
    time_s: float = 0.0
    step: int | None = None
    detection_s: float | None = None
    switch_step: int | None = None

    def to_json(self) -> dict:
        out = asdict(self)
        out["alive"], out["removed"] = list(self.alive), list(self.removed)
        return out

    @classmethod
    def from_json(cls, obj: dict) -> Epoch:
        return cls(**{**obj, "alive": tuple(obj["alive"]), "removed": tuple(obj["removed"])})


class Agreement:
    """The membership chain of the run in ``run_dir`` among ``n_ranks`` ranks, seen by ``rank``."""

    def __init__(self, run_dir: str | os.PathLike[str], n_ranks: int, rank: int) -> None:
        self.root = Path(run_dir) / MEMBERSHIP_DIR
        self.root.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self.current = Epoch(0, tuple(range(n_ranks)))
        #: every epoch read so far, oldest first (epoch 0 included)
        self.chain: list[Epoch] = [self.current]

    def _path(self, epoch: int) -> Path:
        return self.root / f"epoch{epoch:08d}.json"

    def refresh(self) -> Epoch:
        """Read the epochs written since the last look (one ``stat`` when there is none); raise
        :class:`Removed` when this rank is no longer alive in the newest."""
        while True:
            try:
                text = self._path(self.current.epoch + 1).read_text()
            except FileNotFoundError:
                break
            self.current = Epoch.from_json(json.loads(text))
            self.chain.append(self.current)
        if self.rank not in self.current.alive:
            e = self.current
            raise Removed(
                f"rank {self.rank} was given up for dead by rank {e.by} at epoch {e.epoch} (step {e.step}): "
                f"it did not answer within the deadline"
            )
        return self.current

    def remove(
        self,
        dead: Iterable[int],
        *,
        step: int | None = None,
        detection_s: float | None = None,
        switch_after: int | None = None,
    ) -> Epoch:
        """Agree that ``dead`` are gone: the newest epoch once every rank of ``dead`` is out of it
        (written by this rank or by another that found them first). ``switch_after``: an epoch this
        rank writes switches schedules at ``step + switch_after`` (None: at once)."""
        dead = set(dead)
        while True:
            current = self.refresh()
            left = sorted(dead & set(current.alive))
            if not left:
                return current
            proposal = Epoch(
                current.epoch + 1,
                tuple(r for r in current.alive if r not in dead),
                tuple(left),
                by=self.rank,
                time_s=time.time(),
                step=step,
                detection_s=detection_s,
                switch_step=None if switch_after is None or step is None else step + switch_after,
            )
            if self._create(proposal):
                self.current = proposal
                self.chain.append(proposal)
                return proposal
            # another survivor wrote this epoch first: read it and try again on top of it

    def _create(self, proposal: Epoch) -> bool:
        """Write ``proposal`` as its epoch unless that epoch exists; True when this call made it."""
        tmp = temporary_path(self._path(proposal.epoch), tag=str(self.rank))
        try:  # the temporary file goes whatever fails (a full disk while writing it, say)
            with open(tmp, "w") as fh:
                json.dump(proposal.to_json(), fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.link(tmp, self._path(proposal.epoch))
            return True
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                raise
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def history(self) -> list[Epoch]:
        """Every epoch written, oldest first (for the run's summary)."""
        found = sorted(int(m.group(1)) for p in self.root.iterdir() if (m := _EPOCH.match(p.name)))
        return [Epoch.from_json(json.loads(self._path(k).read_text())) for k in found]
