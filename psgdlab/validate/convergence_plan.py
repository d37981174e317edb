r"""What ``psgdlab validate --convergence`` runs: the workloads, the grid of cases, and how each is trained.

A **case** is a workload (:data:`WORKLOADS`), an algorithm case (:data:`CONVERGENCE_CASES`, the
names of :data:`psgdlab.validate.plan.ALGORITHM_CASES`), a number of workers, a per-worker batch
and a straggler; it runs with every seed of :attr:`ConvergenceConfig.seeds`.

How every run of a workload is trained (:class:`WorkloadSpec`), the same for the reference run,
the emulated runs and the measured cases, so that one learning curve describes them all:

- **the learning rate scales linearly with the total batch** (:math:`\eta = \eta_1 B`, the rule the
  convergence model assumes: :mod:`psgdlab.core.convergence`); FSDD's from the README's recipe
  (0.2 at a total batch of 32, momentum 0.9), decaying as the recipe does, tenfold over
  ``decay_epochs`` epochs (``exp`` with the final rate that the run's length gives, so the rate
  at an epoch is the same whatever the run's length); least squares at a constant rate;
- **emulated compute** (``--compute-time``; :mod:`psgdlab.core.platform.timing`): a step of ``b`` samples
  computes for :math:`c_0 + c_1 b` seconds whatever the number of workers, as on a device of
  its own (the real gradient is computed inside that time; 8 workers of FSDD on 2 cores fit in
  it), so up to 8 workers run on this machine with the timing of a platform the simulator
  models;
- the held-out loss of the workers' mean model at regular points of wall time
  (``--evaluate-every-s``): FSDD on speakers theo and george, a seeded subset of their
  utterances (scoring after training costs minutes per run on the full set); least squares its
  population loss in closed form.

The **default** (``psgdlab validate --convergence``) is least squares alone, its default grid
(10 cases, 2 seeds); FSDD runs when named (``--workloads fsdd,lsq --data fsdd.h5``: its reference
run, 5 emulated and 10 measured runs of 8 workers take tens of minutes on this shared 2-core
machine); ``--full`` is the grid of issue 42 (docs/time-to-accuracy.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from psgdlab.core.errors import require
from psgdlab.core.platform.stragglers import StragglerModel
from psgdlab.validate.plan import ALGORITHM_CASES

__all__ = [
    "CONVERGENCE_CASES",
    "WORKLOADS",
    "WorkloadSpec",
    "ConvergenceConfig",
    "Case",
    "cases",
    "TARGETS",
    "SCALES",
]

#: the algorithm cases of issue 42 (ALGORITHM_CASES' names)
CONVERGENCE_CASES = ("ssgd", "bmuf", "adpsgd", "adpsgd-random", "hadpsgd")
#: where the staleness, learner and period scales of the predictions come from
SCALES = ("emulated", "prior")
#: issue 42's targets for FSDD on this machine
TARGETS = {
    "median_abs_time_to_target_error": 0.10,
    "max_abs_time_to_target_error": 0.25,
    "coverage": 0.80,
}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadSpec:
    """How one workload of the validation is trained (module docstring).

    ``lr_per_sample`` times the total batch is the rate; ``decay_epochs`` (``exp`` only) the
    epochs over which it falls tenfold; ``compute_s`` the emulated compute :math:`(c_0, c_1)`;
    ``reference`` the ``(workers, batch)`` of the reference run (ssgd), ``reference_epochs``
    its length and ``reference_every_s`` the wall seconds between its held-out points;
    ``target_at`` where on the reference's held-out curve the default target is (a fraction of
    its epochs); ``eval_points`` the snapshots of a measured run; ``held_out_per_speaker`` the
    held-out utterances kept of each held-out speaker (FSDD); ``lsq_dim`` and ``lsq_rows`` the
    least-squares problem; ``grid`` the default ``(workers, batches)`` and ``full`` those of
    ``--full``.
    """

    name: str
    model: str
    lr_per_sample: float
    lr_schedule: str
    momentum: float | None
    compute_s: tuple[float, float]
    reference: tuple[int, int]
    reference_epochs: float
    grid: tuple[tuple[int, ...], tuple[int, ...]]
    full: tuple[tuple[int, ...], tuple[int, ...]]
    reference_every_s: float = 1.0
    decay_epochs: float | None = None
    target_at: float = 0.6
    eval_points: int = 12
    held_out_per_speaker: int = 0
    lsq_dim: int = 16
    lsq_rows: int = 0

    def lr(self, total_batch: int) -> float:
        """The rate at ``total_batch`` samples per step (linear scaling)."""
        return self.lr_per_sample * total_batch

    def lr_final(self, total_batch: int, epochs: float) -> float | None:
        """``exp``: the rate after ``epochs`` epochs (tenfold lower every ``decay_epochs``)."""
        if self.lr_schedule != "exp" or self.decay_epochs is None:
            return None
        return self.lr(total_batch) * 10.0 ** (-epochs / self.decay_epochs)

    def compute_time_s(self, batch: int) -> float:
        """The emulated compute of a step of ``batch`` samples."""
        c0, c1 = self.compute_s
        return c0 + c1 * batch


#: the workloads: FSDD's BiLSTM with the README's recipe, and least squares
WORKLOADS: dict[str, WorkloadSpec] = {
    "fsdd": WorkloadSpec(
        name="fsdd",
        model="blstm-small",
        lr_per_sample=0.2 / 32,
        lr_schedule="exp",
        decay_epochs=5.0,
        momentum=0.9,
        compute_s=(0.1, 0.04),
        reference=(2, 16),
        reference_epochs=2.5,
        reference_every_s=2.5,
        target_at=0.6,
        grid=((8,), (4,)),
        full=((2, 4, 8), (4, 8)),
        eval_points=12,
        held_out_per_speaker=20,
    ),
    "lsq": WorkloadSpec(
        name="lsq",
        model="least-squares",
        lr_per_sample=1e-3,
        lr_schedule="const",
        momentum=None,
        compute_s=(0.015, 0.0005),
        reference=(2, 4),
        reference_epochs=0.5,
        reference_every_s=0.1,
        target_at=0.6,
        grid=((2, 8), (4,)),
        full=((2, 4, 8), (4, 8)),
        eval_points=25,
        lsq_dim=512,
        lsq_rows=16384,
    ),
}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One configuration of the grid (its seeds are the config's)."""

    workload: str
    algorithm_case: str
    workers: int
    batch: int
    straggler: str = ""

    @property
    def algorithm(self) -> str:
        return ALGORITHM_CASES[self.algorithm_case][0]

    @property
    def variant(self) -> str | None:
        return ALGORITHM_CASES[self.algorithm_case][1]

    @property
    def total_batch(self) -> int:
        return self.workers * self.batch

    @property
    def name(self) -> str:
        """``fsdd-adpsgd-random-w8-b4`` (``-straggler`` with one)."""
        tail = "-straggler" if self.straggler else ""
        return f"{self.workload}-{self.algorithm_case}-w{self.workers}-b{self.batch}{tail}"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "workload": self.workload,
            "algorithm": self.algorithm_case,
            "workers": self.workers,
            "batch": self.batch,
            "total_batch": self.total_batch,
            "straggler": self.straggler,
        }


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ConvergenceConfig:
    """What ``psgdlab validate --convergence`` runs (its flags).

    ``workers`` and ``batches`` (``None``: each workload's grid, or with ``full`` its full grid)
    apply to every workload; ``targets`` a held-out loss per workload (default: from its
    reference run, :attr:`WorkloadSpec.target_at`); ``data`` the FSDD corpus (``psgdlab data
    fsdd``); ``scales`` where the staleness, learner and period scales come from (:data:`SCALES`);
    ``platform_file`` a calibrated platform to predict with instead of calibrating this machine
    now; ``specs`` workloads trained otherwise than :data:`WORKLOADS` says (by name: smaller
    problems, other recipes).
    """

    out: str
    workloads: tuple[str, ...] = ("lsq",)
    algorithms: tuple[str, ...] = CONVERGENCE_CASES
    workers: tuple[int, ...] | None = None
    batches: tuple[int, ...] | None = None
    stragglers: tuple[str, ...] = ("",)
    seeds: int = 2
    full: bool = False
    data: str | None = None
    held_out_speakers: tuple[str, ...] = ("theo", "george")
    targets: tuple[tuple[str, float], ...] = ()
    scales: str = "emulated"
    backend: str = "gloo"
    gpus_per_node: int = 2
    calibration_runs: int = 1
    min_idle_cores: float = 0.0
    max_idle_wait_s: float = 300.0
    seed: int = 0
    platform_file: str | None = None
    specs: tuple[WorkloadSpec, ...] = ()

    def __post_init__(self) -> None:
        known = {**WORKLOADS, **{s.name: s for s in self.specs}}
        for w in self.workloads:
            require(w in known, "workloads", w, f"must be one of {', '.join(known)}")
        for a in self.algorithms:
            require(a in CONVERGENCE_CASES, "algorithms", a, f"must be one of {', '.join(CONVERGENCE_CASES)}")
        for n in self.workers or ():
            require(isinstance(n, int) and n >= 2 and n % 2 == 0, "workers", n, "must be even integers >= 2")
        for b in self.batches or ():
            require(isinstance(b, int) and b >= 2, "batches", b, "must be integers >= 2")
        require(isinstance(self.seeds, int) and self.seeds >= 1, "seeds", self.seeds, "must be an integer >= 1")
        require(self.scales in SCALES, "scales", self.scales, f"must be one of {', '.join(SCALES)}")
        require(
            "fsdd" not in self.workloads or self.data is not None,
            "data",
            self.data,
            "must name the FSDD corpus for the fsdd workload (psgdlab data fsdd DIR --out fsdd.h5), or leave "
            "fsdd out (--workloads lsq)",
        )
        for name, value in self.targets:
            require(name in self.workloads, "target workload", name, f"must be one of {', '.join(self.workloads)}")
            require(value > 0 and math.isfinite(value), "target", value, "must be a held-out loss > 0")
        for s in self.stragglers:
            StragglerModel.parse(s, seed=0, n_workers=2)

    def spec_of(self, workload: str) -> WorkloadSpec:
        """How ``workload`` is trained: its entry of :attr:`specs`, else of :data:`WORKLOADS`."""
        return next((s for s in self.specs if s.name == workload), None) or WORKLOADS[workload]

    def grid_of(self, workload: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The ``(workers, batches)`` of ``workload``'s cases."""
        spec = self.spec_of(workload)
        workers, batches = spec.full if self.full else spec.grid
        return (self.workers or workers, self.batches or batches)

    def target_of(self, workload: str) -> float | None:
        return dict(self.targets).get(workload)

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["targets"] = dict(self.targets)
        out["specs"] = [dataclasses.asdict(s) for s in self.specs]
        return out


def cases(cc: ConvergenceConfig) -> list[Case]:
    """Every case of ``cc``, in a fixed order: workload, straggler, workers, batch, algorithm.

    >>> [c.name for c in cases(ConvergenceConfig(out="x", workloads=("lsq",), workers=(2,), batches=(8,),
    ...                                          algorithms=("ssgd", "hadpsgd")))]
    ['lsq-ssgd-w2-b8', 'lsq-hadpsgd-w2-b8']
    """
    out = []
    for w in cc.workloads:
        workers, batches = cc.grid_of(w)
        for straggler in cc.stragglers:
            for n in workers:
                for b in batches:
                    out += [
                        Case(workload=w, algorithm_case=a, workers=n, batch=b, straggler=straggler)
                        for a in cc.algorithms
                    ]
    return out


def total_batches(grid: Sequence[Case]) -> list[int]:
    """The total batches of ``grid``, sorted."""
    return sorted({c.total_batch for c in grid})
