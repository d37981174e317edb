r"""The simulator's workload pieces and its configuration files (platform + workload TOML).

The schema (:class:`Workload`, :class:`Defaults`, and the :class:`~psgdlab.core.platform.profile.Profile`
that holds them with a platform, :data:`SimConfig` here) is core's,
:mod:`psgdlab.core.platform.profile`; this module adds the data loader's pauses (:func:`loader_pauses`)
and finds the shipped presets (``sim/presets/NAME.toml``, :func:`preset_names`,
:func:`load_config`) and the sources their values cite (``sim/presets/sources.toml``,
:func:`preset_sources`, :func:`provenance_tags`). Every worker has its own loader; its position
in its buffer at the start of the simulated window is drawn from the stationary distribution,
so workers refill at unrelated steps -- synchronous blocks then wait for whichever worker
refilled.

A configuration file (``--platform FILE.toml``; the shipped presets have the same format) has
the tables ``[platform]`` (with sub-tables ``pcie``, ``nic``, ``nvlink``, ``collective``,
``server``, ``host_cpu``), ``[workload]`` and optionally ``[defaults]`` (``algorithms``,
``workers``, ``period``). Unknown keys are rejected with the closest valid key suggested.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from psgdlab.core.errors import ConfigError
from psgdlab.core.platform.profile import PROCESS_DEVICE, Defaults, Profile, Workload

__all__ = [
    "Workload",
    "Defaults",
    "SimConfig",
    "load_config",
    "with_workload",
    "with_room_for",
    "preset_names",
    "DEFAULT_PRESET",
    "preset_path",
    "SOURCES_FILE",
    "SOURCE_KINDS",
    "preset_sources",
    "provenance_tags",
    "loader_pauses",
]


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


#: the configuration the simulator reads: a core profile (platform, workload, sweep defaults)
SimConfig = Profile


def _presets_dir():
    return resources.files("psgdlab.sim").joinpath("presets")


#: the table of the sources the presets cite, beside them (not a preset)
SOURCES_FILE = "sources.toml"

#: what a source is: a paper, a vendor's data sheet or a standard, figures someone measured, a
#: value computed from cited ones, or an assumption where the sources are silent
SOURCE_KINDS = ("publication", "spec-sheet", "measurement", "derived", "assumption")

_TAG = re.compile(r"\[([A-Za-z][A-Za-z0-9._-]*)")


#: the preset of a command given neither ``--preset`` nor ``--platform``
DEFAULT_PRESET = "interspeech2019-v100"


def preset_names() -> tuple[str, ...]:
    """Names of the shipped presets (files ``sim/presets/NAME.toml``, but the sources table)."""
    folder = _presets_dir()
    return tuple(sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml") and p.name != SOURCES_FILE))


def preset_path(name: str) -> Path:
    """The file of the shipped preset ``name``; an unknown name is a one-line :class:`ConfigError`
    that lists the presets and suggests the closest names."""
    from psgdlab.core.config import unknown

    names = preset_names()
    if name not in names:
        raise unknown("preset", name, names, n=3)
    return Path(str(_presets_dir() / f"{name}.toml"))


def preset_sources() -> dict[str, dict[str, str]]:
    """The sources the presets' values cite, by tag (``sim/presets/sources.toml``): each with its
    ``kind`` (:data:`SOURCE_KINDS`), ``citation`` and ``url`` (``""`` where there is none)."""
    import tomllib

    with _presets_dir().joinpath(SOURCES_FILE).open("rb") as fh:
        return {tag: dict(entry) for tag, entry in tomllib.load(fh).items()}


def provenance_tags(comment: str) -> tuple[str, ...]:
    """The source tags a value's comment cites: the first word of each bracket that opens with a
    letter (``"[S000 §5.1] 100 Gbit/s; [INF, F.8]"`` cites ``S000`` and ``INF``).

    >>> provenance_tags("[DER §D.4] 203 h / 16 epochs on one V100 at 128 samples; CV 5 % [INF]")
    ('DER', 'INF')
    >>> provenance_tags("fitted (prior 0.6, log-sd 0.4); unpinned")
    ()
    """
    return tuple(_TAG.findall(comment))


def load_config(
    *, preset: str | None = None, path: str | Path | None = None, data: dict[str, Any] | None = None
) -> SimConfig:
    """Load a configuration from a preset name, a TOML file, or a dict (exactly one), with the
    compute time set by the device where the profile has the device's law
    (:meth:`~psgdlab.core.platform.profile.Profile.resolved`)."""
    given = [x is not None for x in (preset, path, data)]
    if sum(given) != 1:
        raise ConfigError("give exactly one of preset, path or data")
    if preset is not None:
        path = preset_path(preset)
    if path is not None:
        return Profile.read(path).resolved()
    assert data is not None
    return Profile.from_dict(data, source="<dict>").resolved()


def with_workload(config: SimConfig, name_or_path: str) -> SimConfig:
    """``config`` with its workload replaced by a named one or one from a file
    (:func:`psgdlab.core.platform.workloads.load_workload`), its compute time set by the platform's
    device. A platform that does not give its device (``device_flops_per_s``) cannot price
    another model's compute: that is a one-line error."""
    import dataclasses

    from psgdlab.core.platform.workloads import load_workload

    kept = {k: v for k, v in (config.provenance or {}).items() if not k.startswith("workload")}
    out = dataclasses.replace(
        config, workload=load_workload(name_or_path), provenance=kept, uncertainty=_kept_uncertainty(config)
    )
    if not out.device_law:
        missing = (
            "the platform's device_flops_per_s"
            if out.platform.device_flops_per_s <= 0
            else f"the workload's flops_per_sample ({out.workload.name})"
        )
        raise ConfigError(
            f"--workload ({name_or_path}) needs {missing}: without the device's law the compute time of "
            f"another model is unknown"
        )
    return out.resolved()


def with_room_for(config: SimConfig, n_workers: int) -> tuple[SimConfig, str | None]:
    """``config`` whose hosts hold ``n_workers``, and one line that says what that changed
    (``None``: nothing).

    A platform of worker processes (:data:`~psgdlab.core.platform.profile.PROCESS_DEVICE`: ``psgdlab
    calibrate``'s, the machine that ran its runs, by default as many processes as it has cores)
    holds more workers than that the way ``psgdlab train`` runs them there: more processes on each
    host, sharing its cores, each behind its own link as the calibration measured one. The cores'
    contention is priced where the profile says what communication costs the CPU
    (``[platform.host_cpu]``), and the line says when it is not. Any other platform's devices are
    hardware (a GPU holds one worker): it comes back unchanged, and more workers than its devices
    are refused where they are placed.

    >>> from psgdlab.core.platform.profile import Platform
    >>> cfg = Profile(platform=Platform(name="calibrated", devices_per_host=2, sockets_per_host=2,
    ...                                 device=PROCESS_DEVICE), workload=Workload())
    >>> roomy, said = with_room_for(cfg, 8)
    >>> roomy.platform.devices_per_host
    8
    >>> print(said.split(";")[0])  # doctest: +ELLIPSIS
    calibrated: 1 host of 2 worker processes (as calibrated) runs 8 workers as 8 processes a host, as psgdlab ...
    """
    import dataclasses

    p = config.platform
    per_host = -(-n_workers // p.hosts)
    if p.device != PROCESS_DEVICE or per_host <= p.devices_per_host:
        return config, None
    platform = dataclasses.replace(p, devices_per_host=per_host, sockets_per_host=per_host)
    hosts = f"{p.hosts} host{'s' if p.hosts != 1 else ''}"
    said = (
        f"{p.name}: {hosts} of {p.devices_per_host} worker processes (as calibrated) runs {n_workers} workers as "
        f"{per_host} processes a host, as psgdlab train runs them there"
    )
    cpu = p.host_cpu
    if cpu is not None:
        said += f"; their cores' sharing ({cpu.cores_per_host} a host) priced by [platform.host_cpu]"
    else:
        said += (
            "; the cores they share are not priced (no calibration run had more workers than cores: calibrate "
            "such runs too, or add --probe)"
        )
    return dataclasses.replace(config, platform=platform), said


def _kept_uncertainty(config: SimConfig) -> Any:
    """The profile's uncertainty without the workload's parameters (a new workload replaces them)."""
    import dataclasses

    u = config.uncertainty
    if u is None:
        return None
    keep = [i for i, p in enumerate(u.parameters) if not p.startswith("workload.")]
    return dataclasses.replace(
        u,
        parameters=tuple(u.parameters[i] for i in keep),
        log_sd=tuple(u.log_sd[i] for i in keep),
        correlation=tuple(tuple(u.correlation[i][j] for j in keep) for i in keep) if u.correlation else (),
        unpinned=tuple(p for p in u.unpinned if not p.startswith("workload.")),
    )
