r"""The workload model and the TOML configuration (platform + workload) the simulator reads.

A :class:`Workload` is what one training job asks of the platform:

- ``n_params`` and ``itemsize`` -- the payload :math:`S` = ``n_params * itemsize`` bytes of
  every model or gradient exchange;
- ``compute`` -- the compute time of one step at ``reference_batch`` samples per worker, a
  distribution (:class:`psgdlab.core.timing.ComputeTime` spec: ``"0.171"``,
  ``"lognormal:0.171:0.05"``, ...). At another batch ``b`` the time is scaled affinely:
  :math:`t(b) = t_0 + (\bar t - t_0)\, b / b_\text{ref}` with :math:`t_0` =
  ``compute_fixed_s`` (the part of a step that does not depend on the batch); the spread is
  scaled with it, plus an absolute jitter ``compute_jitter_s`` (seconds of standard deviation that
  do not shrink with the batch: CV :math:`\sqrt{cv^2 + (j/t(b))^2}`);
- ``input_bytes_per_sample`` -- features copied to the device each step over the socket's PCIe
  link, which the devices behind a socket share (0 to ignore);
- ``loader_buffer_samples``, ``loader_s_per_sample`` and ``loader_buffer_cv`` -- a host-side
  data loader that prepares features a buffer at a time (a frame-randomisation buffer, an
  archive of examples): when a worker's buffer runs out, the worker blocks while the next one is
  read and prepared, ``loader_s_per_sample`` seconds per sample of that buffer. Buffer sizes are
  gamma-distributed with mean ``loader_buffer_samples`` and CV ``loader_buffer_cv`` (buffers
  hold whole utterances); 0 samples means a streaming loader that never blocks. Every worker
  has its own loader; its position in its buffer at the start of the simulated window is drawn
  from the stationary distribution, so workers refill at unrelated steps -- synchronous blocks
  then wait for whichever worker refilled (see :func:`loader_pauses`);
- ``samples_per_epoch``, ``epochs``, ``batch_per_worker`` and ``sample_unit`` (what one sample
  is: a 21-frame BLSTM chunk, one frame, ...).

A configuration file (``--platform FILE.toml``; the shipped presets have the same format) has
the tables ``[platform]`` (with sub-tables ``pcie``, ``nic``, ``nvlink``, ``server``),
``[workload]`` and optionally ``[defaults]`` (``algorithms``, ``workers``, ``period``).
Unknown keys are rejected with the closest valid key suggested.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from psgdlab.core.config import check_keys, load_dataclass, load_toml
from psgdlab.core.errors import ConfigError, require
from psgdlab.core.timing import ComputeTime
from psgdlab.sim.platform import Platform

__all__ = ["Workload", "Defaults", "SimConfig", "load_config", "preset_names", "preset_path", "loader_pauses"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """A training job (see the module docstring)."""

    name: str = "model"
    description: str = ""
    n_params: int = 1_000_000
    itemsize: int = 4
    compute: str = "0.1"
    reference_batch: int = 128
    batch_per_worker: int = 128
    compute_fixed_s: float = 0.0
    compute_jitter_s: float = 0.0
    input_bytes_per_sample: float = 0.0
    loader_buffer_samples: float = 0.0
    loader_s_per_sample: float = 0.0
    loader_buffer_cv: float = 0.0
    samples_per_epoch: float = 1e6
    epochs: float = 1.0
    sample_unit: str = "samples"

    def __post_init__(self) -> None:
        require(isinstance(self.n_params, int) and self.n_params >= 1, "n_params", self.n_params,
                "must be an integer >= 1")
        require(self.itemsize in (1, 2, 4, 8), "itemsize", self.itemsize, "must be 1, 2, 4 or 8 bytes")
        dist = ComputeTime.parse(self.compute)
        for name in ("reference_batch", "batch_per_worker"):
            v = getattr(self, name)
            require(isinstance(v, int) and not isinstance(v, bool) and v >= 1, name, v, "must be an integer >= 1")
        require(math.isfinite(self.compute_fixed_s) and 0 <= self.compute_fixed_s <= dist.mean_s, "compute_fixed_s",
                self.compute_fixed_s, f"must be in [0, the mean compute time {dist.mean_s:g} s]")
        require(math.isfinite(self.compute_jitter_s) and self.compute_jitter_s >= 0, "compute_jitter_s",
                self.compute_jitter_s, "must be >= 0 seconds")
        require(math.isfinite(self.input_bytes_per_sample) and self.input_bytes_per_sample >= 0,
                "input_bytes_per_sample", self.input_bytes_per_sample, "must be >= 0")
        require(math.isfinite(self.loader_buffer_samples) and (self.loader_buffer_samples == 0
                                                               or self.loader_buffer_samples >= 1),
                "loader_buffer_samples", self.loader_buffer_samples, "must be 0 (streaming) or >= 1 samples")
        require(math.isfinite(self.loader_s_per_sample) and self.loader_s_per_sample >= 0, "loader_s_per_sample",
                self.loader_s_per_sample, "must be >= 0 seconds")
        require(math.isfinite(self.loader_buffer_cv) and 0 <= self.loader_buffer_cv <= 10, "loader_buffer_cv",
                self.loader_buffer_cv, "must be in [0, 10]")
        require(self.samples_per_epoch > 0, "samples_per_epoch", self.samples_per_epoch, "must be > 0")
        require(self.epochs > 0, "epochs", self.epochs, "must be > 0")

    @property
    def payload_bytes(self) -> int:
        return self.n_params * self.itemsize

    @property
    def compute_time(self) -> ComputeTime:
        """The compute-time distribution at ``batch_per_worker`` (scaled from the reference)."""
        dist = ComputeTime.parse(self.compute)
        mean = self.mean_compute_s(self.batch_per_worker)
        if mean == dist.mean_s and self.compute_jitter_s == 0:
            return dist
        j = self.compute_jitter_s
        if dist.kind == "normal":
            spread = math.hypot(dist.spread * mean / dist.mean_s, j)
        else:
            spread = math.hypot(dist.spread, j / mean)
        kind = "lognormal" if dist.kind == "const" and j > 0 else dist.kind
        return ComputeTime(kind=kind, mean_s=mean, spread=spread)

    def mean_compute_s(self, batch: int) -> float:
        t_ref = ComputeTime.parse(self.compute).mean_s
        t0 = self.compute_fixed_s
        return t0 + (t_ref - t0) * batch / self.reference_batch

    def with_batch(self, batch: int | None) -> "Workload":
        if batch is None:
            return self
        from dataclasses import replace

        return replace(self, batch_per_worker=batch)


def loader_pauses(workload: Workload, steps: int, rng: np.random.Generator) -> np.ndarray:
    r"""Seconds one worker blocks on its data loader at each of ``steps`` steps (shape ``(steps,)``).

    Step ``s`` consumes samples :math:`[s b, (s+1) b)` of the worker's stream (``b`` =
    ``batch_per_worker``). The stream is cut into buffers of :math:`L_k` samples,
    :math:`L_k \sim \text{Gamma}` with mean :math:`F` = ``loader_buffer_samples`` and CV
    ``loader_buffer_cv``; a step that reaches the end of a buffer first loads the next one,
    blocking for ``loader_s_per_sample`` :math:`\times L_{k+1}` (several when buffers are smaller
    than a batch). The window starts in steady state: the buffer in use at sample 0 is drawn
    length-biased (:math:`\text{Gamma}(k+1)` for shape :math:`k`) and the position in it
    uniformly, so its remainder has the renewal process's stationary law. On average a step
    blocks :math:`b \cdot` ``loader_s_per_sample``, the same as a single worker; what differs in
    parallel is *when*: synchronous groups wait for whichever member is refilling.

    Examples
    --------
    >>> w = Workload(batch_per_worker=100, loader_buffer_samples=1000, loader_s_per_sample=1e-3)
    >>> p = loader_pauses(w, 50, np.random.default_rng(0))
    >>> int(np.count_nonzero(p)), float(p.max())  # one 1-second refill every 10 steps
    (5, 1.0)
    """
    out = np.zeros(steps)
    F, c = workload.loader_buffer_samples, workload.loader_s_per_sample
    if F <= 0 or c <= 0 or steps < 1:
        return out
    b = workload.batch_per_worker
    cv = workload.loader_buffer_cv
    shape = 1.0 / (cv * cv) if cv > 0 else 0.0

    def buffers(k: int) -> np.ndarray:
        return rng.gamma(shape, F / shape, k) if shape else np.full(k, F)

    first = rng.gamma(shape + 1.0, F / shape) if shape else F  # length-biased: the buffer in use
    start = rng.random() * first  # samples left in it at the start of the window
    total = steps * b
    n = int(total / F * 1.25) + 8
    sizes = buffers(n)
    while start + sizes.sum() - sizes[-1] < total:  # boundaries must cover the window
        sizes = np.concatenate([sizes, buffers(n)])
    ends = start + np.concatenate(([0.0], np.cumsum(sizes[:-1])))  # where buffer k (loaded then) begins
    loaded = np.concatenate(([0.0], np.cumsum(sizes)))  # samples loaded by the first j refills
    edges = np.searchsorted(ends, np.arange(steps + 1) * float(b), side="left")
    out[:] = c * np.diff(loaded[edges])
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Defaults:
    """Sweep defaults a configuration file may set."""

    algorithms: tuple[str, ...] = ("ssgd", "adpsgd", "hadpsgd")
    workers: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    period: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    """A platform, a workload and sweep defaults, as loaded from one TOML file."""

    platform: Platform
    workload: Workload
    defaults: Defaults = field(default_factory=Defaults)
    source: str = ""


def _presets_dir():
    return resources.files("psgdlab.sim").joinpath("presets")


def preset_names() -> tuple[str, ...]:
    """Names of the shipped presets (files ``sim/presets/NAME.toml``)."""
    folder = _presets_dir()
    return tuple(sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml")))


def preset_path(name: str) -> Path:
    names = preset_names()
    if name not in names:
        import difflib

        close = difflib.get_close_matches(name, names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"preset {name!r} is not known (known: {', '.join(names)}){hint}")
    return Path(str(_presets_dir() / f"{name}.toml"))


def load_config(*, preset: str | None = None, path: str | Path | None = None,
                data: dict[str, Any] | None = None) -> SimConfig:
    """Load a configuration from a preset name, a TOML file, or a dict (exactly one)."""
    given = [x is not None for x in (preset, path, data)]
    if sum(given) != 1:
        raise ConfigError("give exactly one of preset, path or data")
    if preset is not None:
        path = preset_path(preset)
    if path is not None:
        data = load_toml(path)
        source = str(path)
    else:
        source = "<dict>"
    assert data is not None
    check_keys(data, ("platform", "workload", "defaults"), where=source)
    if "platform" not in data or "workload" not in data:
        raise ConfigError(f"{source}: needs both a [platform] and a [workload] table")
    platform = load_dataclass(Platform, data["platform"], where="platform")
    workload = load_dataclass(Workload, data["workload"], where="workload")
    defaults = load_dataclass(Defaults, data.get("defaults", {}), where="defaults")
    return SimConfig(platform=platform, workload=workload, defaults=defaults, source=source)
