r"""The shipped convergence profiles: published workloads whose papers say how they converge.

**bilstm-43m** (Zhang et al., Interspeech 2019; ALGORITHMS.md §D.1). Table 1 of the study gives the
SWB-2000 word error rate on Hub5-2000 SWB after the recipe's 16 epochs (§C.1: linear scaling from
0.1 at batch 256, 10 warm-up epochs, annealing by :math:`1/\sqrt2` per epoch) at each total batch,
for SSGD and (H-)ADPSGD, "-" where training did not converge: the baseline 7.5 at 256, SSGD 7.6 at
4096 and "-" at 8192, 10240 and 12288, (H-)ADPSGD 7.5, 7.6, 7.5, 7.8 at 4096, 8192, 10240, 12288.
The cells fit the curve of :mod:`psgdlab.core.convergence` at 16 epochs; at one number of epochs
the floor and the curve constant are one direction (:math:`m = m_\infty + K(1 + B/B_\text{noise})
/16` is linear in :math:`B`), so the floor carries a prior, 7.0 % ([INF]: the 16-epoch baseline
half a point above what unlimited training of this model reaches; log-sd 0.05, about
:math:`\pm 0.35` points), and the fit gives :math:`K` and :math:`B_\text{noise}` from the
intercept and the slope of the WER against the batch. The table's rounding to 0.1 and run-to-run
noise give ``metric_sd`` 0.06 points ([INF]). Families: ``sync`` (sgd, ssgd) converges up to the
total batch 4096 ([S000 Tab.1]); ``gossip`` (adpsgd, hadpsgd) up to 12288, the largest the study
tried, on at most 16 learners on the ring ("ADPSGD sees significant accuracy drop when scaling
over more than 16 learners" [S000 §4]; H-ADPSGD's learners are its super-learners, the nodes).
The staleness, learner and period scales are the priors of
:data:`psgdlab.core.convergence.fit.DEFAULT_SCALES` (the table does not vary them). The
profile's own target is the WER of H-ADPSGD on 64 GPUs at 128 per GPU (batch 8192), 7.6 %.

The DNN and CLDNN of Li et al. (ALGORITHMS.md §D.3) have no profile: Tables 4 and 5 give WERs
after a schedule that stops by itself (newbob), at an unreported number of epochs, within
:math:`\pm 0.15` points of each other across batches 256-4096 frames and periods 5-80: they pin no
noise scale and no curve; only ASGD's divergence at period 80 would be a limit.

Examples
--------
>>> p = convergence_profile("bilstm-43m")
>>> p.metric, p.target, [f.name for f in p.families]
('wer', 7.6, ['sync', 'gossip'])
>>> convergence_profile("dnn-13.5m") is None
True
"""

from __future__ import annotations

import functools

from psgdlab.core.convergence import ConvergenceProfile, Estimate, Limit
from psgdlab.core.convergence.fit import PublishedCell, from_published

__all__ = ["BILSTM_TABLE", "convergence_profile", "profile_names"]

_TAB = "[S000 Tab.1]"
#: ALGORITHMS.md §D.1, Table 1 of [S000]: SWB WER (%) after 16 epochs; ``None``: did not converge
BILSTM_TABLE: tuple[PublishedCell, ...] = (
    PublishedCell(algorithm="sgd", total_batch=256, epochs=16.0, metric=7.5, source=_TAB),
    PublishedCell(algorithm="ssgd", total_batch=4096, epochs=16.0, metric=7.6, source=_TAB),
    PublishedCell(algorithm="adpsgd", total_batch=4096, epochs=16.0, metric=7.5, source=_TAB),
    PublishedCell(algorithm="ssgd", total_batch=8192, epochs=16.0, metric=None, source=_TAB),
    PublishedCell(algorithm="hadpsgd", total_batch=8192, epochs=16.0, metric=7.6, source=_TAB),
    PublishedCell(algorithm="ssgd", total_batch=10240, epochs=16.0, metric=None, source=_TAB),
    PublishedCell(algorithm="hadpsgd", total_batch=10240, epochs=16.0, metric=7.5, source=_TAB),
    PublishedCell(algorithm="ssgd", total_batch=12288, epochs=16.0, metric=None, source=_TAB),
    PublishedCell(algorithm="hadpsgd", total_batch=12288, epochs=16.0, metric=7.8, source=_TAB),
)


@functools.cache
def _bilstm_43m() -> ConvergenceProfile:
    return from_published(
        BILSTM_TABLE,
        workload="bilstm-43m",
        metric="wer",
        target=7.6,
        target_source="[S000 Tab.1] H-ADPSGD, 64 GPUs x 128 (batch 8192), SWB",
        samples_per_epoch=34285714.0,  # [DER §D.4] 7.2e8 frames / 21
        floor=Estimate(value=7.0, log_sd=0.05, source="[INF] prior: 0.5 points below the 16-epoch baseline"),
        metric_sd=0.06,
        families={"sync": ("sgd", "ssgd"), "gossip": ("adpsgd", "hadpsgd")},
        learner_limits={
            "gossip": Limit(value=16, source="[S000 §4] significant accuracy drop beyond 16 learners"),
        },
    )


_PROFILES = {"bilstm-43m": _bilstm_43m}


def profile_names() -> tuple[str, ...]:
    """The workloads with a shipped convergence profile."""
    return tuple(sorted(_PROFILES))


def convergence_profile(workload: str) -> ConvergenceProfile | None:
    """The shipped profile of the workload named ``workload`` (:mod:`psgdlab.core.platform.workloads`),
    ``None`` for a workload without one. Fitted at first use and cached."""
    make = _PROFILES.get(workload)
    return make() if make is not None else None
