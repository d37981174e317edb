r"""Named workloads: what one training job asks of a device, apart from any platform.

A calibrated cluster (a profile's ``[platform]``) predicts any model once the model is described
by what it costs: its payload (parameters x bytes), the floating-point work of one sample's
forward and backward pass, the bytes a step moves through device memory whatever its batch (the
weights read by the forward and backward passes and written by the update), the input bytes of a
sample, and the data's size. :func:`workload` turns a name of :data:`WORKLOADS` into a
:class:`~psgdlab.core.profile.Workload`; ``psgdlab predict --workload NAME|FILE`` uses it.

The compute time of a step follows from the device (:meth:`psgdlab.core.profile.Profile.resolved`):

.. math::
    t(b) = \frac{F\,b}{P\,e_c} + \frac{M}{W\,e_m}

with :math:`F` = ``flops_per_sample``, :math:`M` = ``bytes_per_step``, the device's peak
FLOP/s :math:`P` and memory bandwidth :math:`W` (spec sheet), and two efficiencies in (0, 1]
of the platform. The second term is why a small batch does not fill a GPU: the weights are read
and written once per step whatever the batch, so the time per sample grows as the batch shrinks.

Counting rules (:func:`dense_cost`): a weight used once per sample costs 2 FLOPs forward and 4
backward (the input gradient and the weight gradient), so :math:`F = 6\,n_\text{MAC}`; a step
reads every weight twice (forward, backward), writes its gradient once and reads and writes the
weights in the update: :math:`M = 5 \cdot n_\text{params} \cdot` itemsize. Frame-synchronous
models (a DNN, and LSTMs trained frame by frame with truncated back-propagation, as Kaldi's nnet1
does) use each weight once per frame (the first layer needs no input gradient, so the rule
overcounts by 2 FLOPs per weight of that layer: under 3 % for the DNN); a window model (the
BLSTM of the IBM papers) runs its recurrent layers over every frame of the window.

Examples
--------
>>> w = workload("dnn-13.5m")
>>> w.n_params, round(w.flops_per_sample / 1e6, 1), w.input_bytes_per_sample
(13500000, 81.0, 5280.0)
>>> sorted(WORKLOADS)[:2]
['bilstm-43m', 'cldnn-13.8m']
"""

from __future__ import annotations

from dataclasses import dataclass

from psgdlab.core.errors import ConfigError
from psgdlab.core.profile import Workload

__all__ = ["WORKLOADS", "BY_MODEL", "WorkloadEntry", "dense_cost", "workload", "workload_names", "load_workload"]

#: FLOPs per multiply-accumulate per sample over forward + backward (2 forward, 4 backward)
FLOPS_PER_MAC = 6.0
#: passes over the weights per step: read forward, read backward, write the gradient, read and
#: write in the update
WEIGHT_PASSES = 5.0


def dense_cost(macs_per_sample: float, n_params: int, itemsize: int = 4) -> tuple[float, float]:
    """``(flops_per_sample, bytes_per_step)`` of a model whose weights are read once per sample
    (module docstring's counting rules).

    >>> dense_cost(1e6, 1_000_000)
    (6000000.0, 20000000.0)
    """
    return FLOPS_PER_MAC * macs_per_sample, WEIGHT_PASSES * n_params * itemsize


@dataclass(frozen=True, slots=True)
class WorkloadEntry:
    """A named workload with the provenance of its figures (ALGORITHMS.md tags) and the runtime's
    model preset that trains it (``psgdlab train --model``), which names it too."""

    workload: Workload
    provenance: dict[str, str]
    model: str


def _li_et_al(name: str, model: str, description: str, n: int, inputs: int, notes: dict[str, str]) -> WorkloadEntry:
    """A model of Li et al.'s LibriSpeech study (frame-synchronous, 4096-frame minibatches)."""
    flops, traffic = dense_cost(n, n)
    millions = f"{n / 1e6:g}M"
    return WorkloadEntry(
        Workload(
            name=name,
            description=description,
            n_params=n,
            flops_per_sample=flops,
            bytes_per_step=traffic,
            compute="lognormal:0.06:0.02",
            reference_batch=4096,
            batch_per_worker=4096,
            input_bytes_per_sample=inputs * 4.0,
            samples_per_epoch=3.46e8,
            epochs=10.0,
            sample_unit="frames",
        ),
        {
            "n_params": f"[S003 §3.1] {millions}",
            "flops_per_sample": f"[DER] 6 x {millions} (each weight once per frame)",
            "bytes_per_step": f"[DER] 5 passes x {millions} x 4 B",
            "compute": "[INF] spread 2 %; the mean follows from the platform's device",
            "batch_per_worker": "[S003 Tab.4] 4096 frames",
            "samples_per_epoch": "[DER] 960 h x 100 frames/s",
            "epochs": "[INF]",
            **notes,
        },
        model,
    )


def _dnn_13_5m() -> WorkloadEntry:
    return _li_et_al(
        "dnn-13.5m",
        "dnn",
        "Li et al. DNN: 6x1024 ReLU, 1320 inputs (40 FBANK+D+DD, 11 frames), 5723 states",
        13_500_000,
        1320,
        {"input_bytes_per_sample": "[DER] 1320 fp32 inputs"},
    )


def _cldnn_13_8m() -> WorkloadEntry:
    return _li_et_al(
        "cldnn-13.8m",
        "cldnn",
        "Li et al. CLDNN: conv 128 maps, 2 LSTM 1024/512 proj, 2 DNN 1024, 5723 states, FBANK+D",
        13_800_000,
        80,
        {
            "flops_per_sample": "[DER] 6 x 13.8M: frame-synchronous LSTM training (truncated BPTT), each weight "
            "once per frame [INF]",
            "batch_per_worker": "[INF] the DNN's 4096 frames; the paper does not give the CLDNN's",
            "input_bytes_per_sample": "[DER] 80 fp32 inputs (FBANK + D), no frame splicing",
        },
    )


def _bilstm_43m() -> WorkloadEntry:
    n = 43_130_368
    window = 21
    # recurrent and projection weights run over the 21 frames of a sample; the 32k softmax once per frame
    flops, _ = dense_cost(window * n, n)
    return WorkloadEntry(
        Workload(
            name="bilstm-43m",
            description="6-layer BLSTM, 512 cells/direction, 256 projection, 32k outputs; SWB-2000, 21-frame samples",
            n_params=n,
            flops_per_sample=flops,
            bytes_per_step=WEIGHT_PASSES * n * 4,
            compute="lognormal:0.171:0.05",
            reference_batch=128,
            batch_per_worker=128,
            input_bytes_per_sample=21 * 260 * 4.0,
            samples_per_epoch=34285714.0,
            epochs=16.0,
            sample_unit="21-frame samples",
        ),
        {
            "n_params": "[DER §D.4] 172.5 MB = 164.5 MiB fp32",
            "flops_per_sample": "[DER] 6 x 21 frames x 43.1M (every layer over every frame of the window)",
            "bytes_per_step": "[DER] 5 passes x 43.1M x 4 B",
            "compute": "[DER §D.4] 203 h / 16 epochs on one V100 at 128 samples; CV 5 % [INF]",
            "batch_per_worker": "[S000 §6.2] 128 per GPU",
            "input_bytes_per_sample": "[DER] 21 frames x 260 dims x 4 B",
            "samples_per_epoch": "[DER §D.4] 7.2e8 frames / 21",
            "epochs": "[S000 §6.2]",
        },
        "blstm",
    )


#: the named workloads (the published models of ALGORITHMS.md §D)
WORKLOADS: dict[str, WorkloadEntry] = {e.workload.name: e for e in (_bilstm_43m(), _dnn_13_5m(), _cldnn_13_8m())}


#: the named workloads by the runtime's model preset that trains each (``train --model``)
BY_MODEL: dict[str, str] = {e.model: name for name, e in WORKLOADS.items()}


def workload_names() -> tuple[str, ...]:
    """The workloads' names, then the runtime's model presets that name them too."""
    return (*sorted(WORKLOADS), *sorted(BY_MODEL))


def workload(name: str) -> Workload:
    """The workload named ``name``, or trained by the runtime's model preset ``name``
    (:data:`BY_MODEL`: ``cldnn`` is ``cldnn-13.8m``); an unknown name is a one-line error with
    the closest name.

    >>> workload("cldnn") == workload("cldnn-13.8m")
    True
    """
    key = BY_MODEL.get(name, name)
    if key not in WORKLOADS:
        from psgdlab.core.config import closest

        raise ConfigError(
            f"workload {name!r} is not known (known: {', '.join(workload_names())}){closest(name, workload_names())}"
        )
    return WORKLOADS[key].workload


def load_workload(name_or_path: str) -> Workload:
    """A workload by name (:data:`WORKLOADS`) or from a TOML file with a ``[workload]`` table (the
    profile's schema; unknown keys rejected with the closest key suggested)."""
    if name_or_path in workload_names() or not name_or_path.endswith(".toml"):
        return workload(name_or_path)
    from psgdlab.core.config import check_keys, load_dataclass, load_toml

    data = load_toml(name_or_path)  # a missing or malformed file is a one-line error there
    check_keys(data, ("workload",), where=name_or_path)
    if "workload" not in data:
        raise ConfigError(f"workload file {name_or_path} needs a [workload] table")
    return load_dataclass(Workload, data["workload"], where="workload")
