r"""Named workloads: what one training job asks of a device, apart from any platform.

A calibrated cluster (a profile's ``[platform]``) predicts any model once the model is described
by what it costs: its payload (parameters x bytes), the floating-point work of one sample's
forward and backward pass, the bytes a step moves through device memory whatever its batch (the
weights read by the forward and backward passes and written by the update), the input bytes of a
sample, and the data's size. :func:`workload` turns a name of :data:`WORKLOADS` into a
:class:`~psgdlab.core.platform.profile.Workload`; ``psgdlab predict --workload NAME|FILE`` uses it.

The compute time of a step follows from the device (:meth:`psgdlab.core.platform.profile.Profile.resolved`):

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
BLSTM of the IBM papers) runs its recurrent layers over every frame of the window. A model whose
weights are used a different number of times per sample (convolutions, attention, a transducer's
joint network) counts its multiply-accumulates from its definition (:func:`conformer_cost`) and
takes the same 6 FLOPs per MAC and 5 passes over its weights.

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
from psgdlab.core.platform.profile import Workload

__all__ = [
    "WORKLOADS",
    "BY_MODEL",
    "WorkloadEntry",
    "dense_cost",
    "ConformerShape",
    "conformer_cost",
    "workload",
    "workload_names",
    "workload_toml",
    "load_workload",
]

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


@dataclass(frozen=True, slots=True, kw_only=True)
class ConformerShape:
    """The hyper-parameters of a Conformer transducer (Gulati et al. 2020, Table 1) and of the
    utterance it is costed on.

    ``d_model``, ``layers``, ``conv_kernel``, ``ffn_factor``: the encoder (``heads`` splits
    ``d_model`` and changes neither the weights nor the MACs); ``features``: filter-bank channels
    of the input; ``decoder_dim``: the one-layer LSTM prediction network, its embedding and the
    joint network; ``vocabulary``: word pieces (plus a blank); ``frames``: 10 ms input frames of
    the utterance; ``tokens``: its word pieces.

    The defaults are Conformer (L) on the mean utterance of LibriSpeech's 960 h of training data
    (281,241 utterances: 12.29 s, 1229 frames). Gulati et al. give the encoder's and the
    decoder's sizes and 80 filter-bank channels; the vocabulary (1k word pieces), the joint
    network's width (the decoder's) and the 50 word pieces of a mean utterance (about 33 words of
    read speech at 1.5 pieces a word) are assumptions of this count.
    """

    d_model: int = 512
    layers: int = 17
    conv_kernel: int = 32
    ffn_factor: int = 4
    features: int = 80
    decoder_dim: int = 640
    vocabulary: int = 1024
    frames: int = 1229
    tokens: int = 50


def conformer_cost(shape: ConformerShape) -> tuple[int, float]:
    r"""``(n_params, macs_per_utterance)`` of a Conformer transducer: the forward pass's
        multiply-accumulates over one utterance (:class:`ConformerShape`).

        The parts, with :math:`d` = ``d_model``, :math:`k` = ``conv_kernel``, :math:`D` =
        ``decoder_dim``, :math:`V` = ``vocabulary`` + 1 (the blank), :math:`U` = ``tokens``:

        - convolutional subsampling (ESPnet's ``Conv2dSubsampling``, which Gulati et al.'s figure 1
          draws without its sizes): two 3x3 convolutions of stride 2 with :math:`d` channels over
          time and frequency, then a linear layer from :math:`d \cdot F_2` to :math:`d`, leaving
          :math:`T = \lfloor(\lfloor(T_{in}-1)/2
    floor-1)/2
    floor` frames of 40 ms;
        - each of the ``layers`` blocks: two half-step feed-forward modules (:math:`d 	o 4d 	o d`),
          multi-head self-attention with relative positions (ESPnet's
          ``RelPositionMultiHeadedAttention``: query, key, value and output projections, a
          projection of the :math:`2T-1` relative positions and two bias vectors), the convolution
          module (point-wise :math:`d 	o 2d` with a GLU, depth-wise of width :math:`k`, batch norm,
          point-wise :math:`d 	o d`) and four layer norms plus the block's last:
          :math:`24d^2 + (k + 32)d` weights; per frame :math:`23d^2 + kd` MACs, and per block and
          utterance :math:`T^2 d` (scores) :math:`+\; T(2T-1)d` (relative-position scores)
          :math:`+\; T^2 d` (weighted values) :math:`+\; (2T-1)d^2` (position projection);
        - the prediction network: an embedding of the :math:`V` symbols and one LSTM layer of
          :math:`D` cells over the :math:`U + 1` labels;
        - the joint network: projections of the encoder (:math:`d 	o D`) and of the prediction
          network (:math:`D 	o D`), and the output layer :math:`D 	o V` on each of the
          :math:`T (U + 1)` pairs of frame and label.

        Biases count as weights and cost no MACs; norms, activations and the softmax cost no MACs.

        >>> n, macs = conformer_cost(ConformerShape())  # Conformer (L): 118.8M published
        >>> round(n / 1e6, 1), round(macs / 1e9, 1)
        (120.2, 63.3)
        >>> round(conformer_cost(ConformerShape(d_model=144, layers=16, decoder_dim=320))[0] / 1e6, 2)  # (S): 10.3M
        10.32
    """
    d, k, D, V = shape.d_model, shape.conv_kernel, shape.decoder_dim, shape.vocabulary + 1
    f = shape.ffn_factor
    # subsampling: conv(1 -> d, 3x3, stride 2), conv(d -> d, 3x3, stride 2), linear(d * F2 -> d)
    t1, f1 = (shape.frames - 1) // 2, (shape.features - 1) // 2
    T, f2 = (t1 - 1) // 2, (f1 - 1) // 2
    sub_params = (9 * d + d) + (9 * d * d + d) + (f2 * d * d + d)
    sub_macs = t1 * f1 * 9 * d + T * f2 * 9 * d * d + T * f2 * d * d
    # one block: 2 feed-forward modules, attention with relative positions, convolution module, 5 norms
    ffn = 2 * (2 * f * d * d + f * d + d)
    attention = 4 * (d * d + d) + d * d + 2 * d
    conv = (2 * d * d + 2 * d) + (k * d + d) + 2 * d + (d * d + d)
    block_params = ffn + attention + conv + 5 * 2 * d
    per_frame = 2 * 2 * f * d * d + 4 * d * d + 2 * d * d + k * d + d * d
    block_macs = T * per_frame + 2 * T * T * d + T * (2 * T - 1) * d + (2 * T - 1) * d * d
    # prediction network (embedding + one LSTM layer) and joint network
    labels = shape.tokens + 1
    lstm = 4 * (D * (D + D) + 2 * D)
    decoder_params = V * D + lstm + (d * D + D) + (D * D + D) + (D * V + V)
    decoder_macs = labels * 4 * D * 2 * D + T * d * D + labels * D * D + T * labels * D * V
    n_params = sub_params + shape.layers * block_params + decoder_params
    return n_params, float(sub_macs + shape.layers * block_macs + decoder_macs)


@dataclass(frozen=True, slots=True)
class WorkloadEntry:
    """A named workload with the provenance of its figures (the tags of ``sim/presets/sources.toml``)
    and the runtime's model preset that trains it (``psgdlab train --model``), which names it
    too; ``None`` where the runtime has none (the workload is for predictions only)."""

    workload: Workload
    provenance: dict[str, str]
    model: str | None = None


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


def _conformer_120m() -> WorkloadEntry:
    """Conformer (L) of Gulati et al. 2020 on LibriSpeech 960 h, one utterance per sample."""
    shape = ConformerShape()
    n, macs = conformer_cost(shape)
    flops, traffic = dense_cost(macs, n)
    return WorkloadEntry(
        Workload(
            name="conformer-120m",
            description="Conformer (L) transducer: 17 blocks of d=512, conv kernel 32, 1-layer LSTM 640 decoder; "
            "LibriSpeech 960 h, one 12.3 s utterance per sample",
            n_params=n,
            flops_per_sample=flops,
            bytes_per_step=traffic,
            compute="lognormal:0.1:0.05",
            reference_batch=32,
            batch_per_worker=32,
            input_bytes_per_sample=shape.frames * shape.features * 4.0,
            samples_per_epoch=281241.0,
            epochs=50.0,
            sample_unit="utterances",
        ),
        {
            "n_params": "[DER] counted from the definition (core/platform/workloads.py conformer_cost); "
            "[GULATI2020 Tab.1] gives 118.8M",
            "itemsize": "[INF] fp32 gradients (mixed precision keeps fp32 weights)",
            "reference_batch": "[INF] the batch the compute law is stated at",
            "flops_per_sample": "[DER] 6 x the forward MACs of a 1229-frame utterance (conformer_cost)",
            "bytes_per_step": "[DER] 5 passes x the weights x 4 B",
            "compute": "[INF] spread 5 %: 32 utterances whose lengths scatter by about 30 %; the mean follows from "
            "the platform's device",
            "batch_per_worker": "[INF] 32 utterances per GPU",
            "input_bytes_per_sample": "[DER] 1229 frames x 80 filter banks [GULATI2020 §3.1] x 4 B",
            "samples_per_epoch": "[LIBRISPEECH] 281,241 utterances in the 960 h of training data",
            "epochs": "[INF] the paper gives training steps, not epochs",
        },
    )


#: the named workloads: the published models of ALGORITHMS.md §D and a transformer-sized one
WORKLOADS: dict[str, WorkloadEntry] = {
    e.workload.name: e for e in (_bilstm_43m(), _dnn_13_5m(), _cldnn_13_8m(), _conformer_120m())
}


#: the named workloads by the runtime's model preset that trains each (``train --model``)
BY_MODEL: dict[str, str] = {e.model: name for name, e in WORKLOADS.items() if e.model is not None}


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
        from psgdlab.core.config import unknown

        raise unknown("workload", name, workload_names(), n=3)
    return WORKLOADS[key].workload


def workload_toml(name: str) -> str:
    """The named workload as a TOML file with one ``[workload]`` table, each value's source in its
    comment, that :func:`load_workload` (``psgdlab predict --workload FILE.toml``) reads back to
    :func:`workload` of ``name``.

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "dnn.toml"
    >>> _ = path.write_text(workload_toml("dnn"))
    >>> load_workload(str(path)) == workload("dnn-13.5m")
    True
    """
    from psgdlab.core.platform.profile import Platform, Profile

    w = workload(name)
    notes = (
        f"The named workload {w.name} (psgdlab workload show {w.name}); tags in brackets name the sources of",
        "sim/presets/sources.toml. Edit it and pass it with psgdlab predict --workload FILE.toml: its compute",
        "time follows from the platform's device (flops_per_sample, bytes_per_step).",
    )
    provenance = {f"workload.{key}": text for key, text in WORKLOADS[w.name].provenance.items()}
    return Profile(platform=Platform(), workload=w, notes=notes, provenance=provenance).to_toml(tables=("workload",))


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
