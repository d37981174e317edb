r"""Calibrate the ``librispeech-gtx1080`` preset against Tables 4 and 5 of Li et al. (S003).

Li et al. (arXiv 1703.05880) trained a 13.5M-parameter DNN on one node of 8 GTX1080 with Kaldi
and OpenMPI; ALGORITHMS.md §D.3 gives their Table 4 (ASGD and BMUF, 4 GPUs, minibatch 4096,
period 5/20/80) and Table 5 (BMUF, 4 GPUs, minibatch 256/1024/4096, period 5/20/80) speedups.
Tables 1-3 are held out for validation and are not used here.

:func:`fit_gtx1080` fits a few physical parameters by least squares on the relative error of the
**simulated** speedups (every evaluation runs the simulator):

- ``compute_fixed_s`` -- the part of a minibatch's compute time that does not grow with the
  minibatch (kernel launches, Kaldi per-minibatch work), with the mean at 4096 frames fixed at
  ``COMPUTE_4096_S``; compute time is affine in the minibatch;
- ``cv`` and ``compute_jitter_s`` -- the relative and the absolute (batch-independent) spread of
  the per-step compute time (log-normal), which make synchronous blocks wait for the slowest
  worker, most for small minibatches and short periods;
- ``pcie_bandwidth_bytes_per_s`` -- the effective per-socket bandwidth of the (host-staged, MPI)
  path the GPUs share, used by the model allreduce and the input feature copies;
- ``input_bytes_per_sample`` -- the effective host-to-device traffic per frame through the shared
  socket (1320 fp32 features are 5,280 B; the fit absorbs the host-side data pipeline the
  workers contend for, which is what caps the 4-GPU speedup below 4 at long periods);
- ``server_bandwidth_bytes_per_s`` and ``service_overhead_s`` -- the parameter server of ASGD.

:func:`write_preset` writes ``sim/presets/librispeech-gtx1080.toml`` (atomically) with the fitted
values and the residuals in comments; ``python -m psgdlab.sim.fit`` does both (several minutes).

Known limit: the minibatch-256 row of Table 5 (1.85, 2.54, 3.21 at periods 5, 20, 80) cannot be
matched within 5 % by this model family together with the other rows: the best minimax fit
leaves -5.3 %, +5.3 %, -5.3 % there (the row needs a per-step cost that falls more slowly with
the period than any mix of a per-block cost and a max-of-sums straggler term allows while the
4096 row caps at 2.93). The test marks those three entries as expected failures. The test
``tests/sim/test_fit.py`` re-runs the simulator with the shipped preset and checks every table
entry within 5 %.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from psgdlab.core.trace import atomic_write_text

__all__ = ["TABLE_TARGETS", "COMPUTE_4096_S", "FitResult", "gtx1080_config", "simulated_speedups",
           "fit_gtx1080", "write_preset"]

#: (algorithm, minibatch frames, period) -> published speedup on 4 GPUs (ALGORITHMS.md §D.3,
#: Tables 4 and 5; Table 4's BMUF rows are Table 5's minibatch-4096 rows)
TABLE_TARGETS: dict[tuple[str, int, int], float] = {
    ("asgd", 4096, 5): 2.74,
    ("asgd", 4096, 20): 2.96,
    ("bmuf", 4096, 5): 2.68,
    ("bmuf", 4096, 20): 2.90,
    ("bmuf", 4096, 80): 2.93,
    ("bmuf", 256, 5): 1.85,
    ("bmuf", 256, 20): 2.54,
    ("bmuf", 256, 80): 3.21,
    ("bmuf", 1024, 5): 2.14,
    ("bmuf", 1024, 20): 2.76,
    ("bmuf", 1024, 80): 2.98,
}
WORKERS = 4
#: mean compute time of one 4096-frame minibatch on one GTX1080 [INF]: 6 x 13.5e6 x 4096 flops
#: = 332 GFLOP at ~5.5 TFLOP/s sustained; speedups depend only on ratios, so this sets the scale
COMPUTE_4096_S = 0.06
PARAM_NAMES = ("compute_fixed_s", "cv", "compute_jitter_s", "pcie_bandwidth_bytes_per_s", "input_bytes_per_sample",
               "server_bandwidth_bytes_per_s", "service_overhead_s")
FIT_STEPS_BLOCKS = 12  # simulated window: this many sync periods (>= 240 steps)


@dataclass(frozen=True, slots=True)
class FitResult:
    params: dict[str, float]
    speedups: dict[tuple[str, int, int], float]
    relative_errors: dict[tuple[str, int, int], float]

    @property
    def max_relative_error(self) -> float:
        return max(abs(e) for e in self.relative_errors.values())


def gtx1080_config(params: dict[str, float]) -> dict[str, Any]:
    """The preset as a dict (TOML layout) for the given fitted parameters."""
    return {
        "platform": {
            "name": "librispeech-gtx1080",
            "description": "one node of 8 GTX1080, Kaldi + OpenMPI (Li et al. 2017), calibrated on Tables 4-5",
            "hosts": 1, "devices_per_host": 8, "sockets_per_host": 2, "device": "GTX1080",
            "host_memory_bandwidth_bytes_per_s": 2.0e10, "staging": "host",
            "pcie": {"latency_s": 1.0e-5, "bandwidth_bytes_per_s": float(params["pcie_bandwidth_bytes_per_s"])},
            "nic": {"latency_s": 2.0e-5, "bandwidth_bytes_per_s": 1.25e9},
            "server": {"latency_s": 1.0e-5, "bandwidth_bytes_per_s": float(params["server_bandwidth_bytes_per_s"]),
                       "service_overhead_s": float(params["service_overhead_s"]), "apply_on_host": True},
        },
        "workload": {
            "name": "dnn-13.5m", "description": "6x1024 ReLU DNN, 1320 inputs (40 FBANK+D+DD, 11 frames), 5723 states",
            "n_params": 13_500_000, "itemsize": 4,
            "compute": f"lognormal:{COMPUTE_4096_S}:{float(params['cv']):.6g}",
            "reference_batch": 4096, "batch_per_worker": 4096,
            "compute_fixed_s": float(params["compute_fixed_s"]),
            "compute_jitter_s": float(params["compute_jitter_s"]),
            "input_bytes_per_sample": float(params["input_bytes_per_sample"]), "samples_per_epoch": 3.46e8, "epochs": 10.0,
            "sample_unit": "frames",
        },
        "defaults": {"algorithms": ["bmuf", "asgd", "bsp", "easgd"], "workers": [1, 2, 4, 8], "period": 5},
    }


def simulated_speedups(params: dict[str, float], *, seed: int = 0,
                       targets: dict[tuple[str, int, int], float] = TABLE_TARGETS) -> dict[tuple[str, int, int], float]:
    """Speedups of every table entry simulated with the preset built from ``params``."""
    from psgdlab.sim.predict import predict_one
    from psgdlab.sim.workload import load_config

    config = load_config(data=gtx1080_config(params))
    out = {}
    for (alg, batch, period) in targets:
        from dataclasses import replace

        cfg = replace(config, workload=config.workload.with_batch(batch))
        steps = max(240, FIT_STEPS_BLOCKS * period)
        pred = predict_one(alg, WORKERS, cfg, steps=steps, period=period, seed=seed, record=True)
        out[(alg, batch, period)] = pred.row["speedup"]
    return out


_X0 = np.array([0.0051, 0.45, 0.003, 3.5e9, 2.2e4, 2.3e10, 0.03])
_SCALE = np.array([0.01, 0.3, 0.003, 1e9, 1e4, 1e9, 1e-2])
_LO = np.array([0.0, 0.0, 0.0, 1e8, 0.0, 1e8, 0.0])
_HI = np.array([COMPUTE_4096_S * 0.99, 3.0, 0.1, 1e11, 1e6, 1e11, 0.5])


def _params(x: np.ndarray) -> dict[str, float]:
    return {k: float(v) for k, v in zip(PARAM_NAMES, x)}


def fit_gtx1080(*, seed: int = 0, max_nfev: int = 40, minimax_iter: int = 300) -> FitResult:
    """Least-squares fit of :data:`PARAM_NAMES` to :data:`TABLE_TARGETS` (relative errors), then a
    Nelder-Mead polish of the largest relative error (``minimax_iter`` iterations; 0 to skip)."""
    from scipy.optimize import least_squares

    keys = list(TABLE_TARGETS)
    target = np.array([TABLE_TARGETS[k] for k in keys])

    def residual(z: np.ndarray) -> np.ndarray:
        sp = simulated_speedups(_params(z * _SCALE), seed=seed)
        return np.array([sp[k] for k in keys]) / target - 1.0

    sol = least_squares(residual, _X0 / _SCALE, bounds=(_LO / _SCALE, _HI / _SCALE), diff_step=0.02,
                        max_nfev=max_nfev, x_scale=1.0)
    z = sol.x
    if minimax_iter:
        # polish: minimise the largest relative error (the acceptance criterion) from the LSQ point
        from scipy.optimize import minimize

        lo, hi = _LO / _SCALE, _HI / _SCALE
        polished = minimize(lambda v: float(np.max(np.abs(residual(np.clip(v, lo, hi))))), z, method="Nelder-Mead",
                            options={"maxiter": minimax_iter, "xatol": 1e-3, "fatol": 1e-4})
        z = np.clip(polished.x, lo, hi)
    params = _refit_server(_params(z * _SCALE), seed=seed)
    sp = simulated_speedups(params, seed=seed)
    return FitResult(params=params, speedups=sp,
                     relative_errors={k: sp[k] / TABLE_TARGETS[k] - 1.0 for k in keys})


def _refit_server(params: dict[str, float], *, seed: int = 0) -> dict[str, float]:
    """Re-solve the two server parameters on the ASGD entries alone (they touch nothing else)."""
    from scipy.optimize import least_squares

    targets = {k: v for k, v in TABLE_TARGETS.items() if k[0] == "asgd"}

    def residual(z: np.ndarray) -> np.ndarray:
        q = {**params, "server_bandwidth_bytes_per_s": z[0] * 1e9, "service_overhead_s": z[1] * 1e-2}
        sp = simulated_speedups(q, seed=seed, targets=targets)
        return np.array([sp[k] / targets[k] - 1.0 for k in targets])

    z0 = [params["server_bandwidth_bytes_per_s"] / 1e9, params["service_overhead_s"] / 1e-2]
    sol = least_squares(residual, z0, bounds=([0.1, 0.0], [100.0, 50.0]), diff_step=0.02, max_nfev=30)
    return {**params, "server_bandwidth_bytes_per_s": float(sol.x[0] * 1e9), "service_overhead_s": float(sol.x[1] * 1e-2)}


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace('"', '\\"') + '"'
    if isinstance(v, float):
        return repr(float(f"{v:.6g}")) if math.isfinite(v) else "nan"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return str(v)


def write_preset(result: FitResult, path: str | Path | None = None) -> Path:
    """Write the fitted preset TOML (with the fit's residuals as comments), atomically."""
    if path is None:
        path = Path(__file__).resolve().parent / "presets" / "librispeech-gtx1080.toml"
    cfg = gtx1080_config(result.params)
    lines = [
        "# Li, Zhang, Xie, Yu, \"Empirical Evaluation of Parallel Training Algorithms on Acoustic Modeling\"",
        "# (arXiv 1703.05880; ALGORITHMS.md §D.3): one node of 8 GTX1080, 13.5M-parameter DNN, LibriSpeech.",
        "# GENERATED by `python -m psgdlab.sim.fit` (sim/fit.py): compute_fixed_s, the compute CV, the",
        "# effective PCIe bandwidth and the parameter server's bandwidth and overhead are least-squares",
        "# fits to the simulated speedups of Tables 4 and 5 (4 GPUs); everything else is physical [DER]/[INF].",
        "# Fitted parameters: " + ", ".join(f"{k}={v:.4g}" for k, v in result.params.items()),
        "# Simulated vs published speedup (algorithm, minibatch, period):",
    ]
    for k, v in result.speedups.items():
        lines.append(f"#   {k[0]} mb={k[1]} period={k[2]}: {v:.3f} vs {TABLE_TARGETS[k]:.2f} "
                     f"({100 * result.relative_errors[k]:+.1f} %)")
    for table in ("platform", "workload", "defaults"):
        body = cfg[table]
        lines.append("")
        lines.append(f"[{table}]")
        subs = []
        for k, v in body.items():
            if isinstance(v, dict):
                subs.append((k, v))
            else:
                lines.append(f"{k} = {_toml_value(v)}")
        for k, sub in subs:
            lines.append("")
            lines.append(f"[{table}.{k}]")
            lines.extend(f"{kk} = {_toml_value(vv)}" for kk, vv in sub.items())
    return atomic_write_text(path, "\n".join(lines) + "\n")


def main() -> None:  # pragma: no cover - a calibration script
    result = fit_gtx1080()
    path = write_preset(result)
    print(f"wrote {path}; max relative error {100 * result.max_relative_error:.1f} %")
    for k, v in result.relative_errors.items():
        print(f"  {k}: {result.speedups[k]:.3f} vs {TABLE_TARGETS[k]} ({100 * v:+.1f} %)")


if __name__ == "__main__":  # pragma: no cover
    main()
