r"""Acoustic models of the papers behind psgdlab.

Every model takes a batch of feature windows of shape ``(batch, window, input_dim)`` and returns
logits of shape ``(batch, n_classes)`` for the window's **centre frame**
(index ``window // 2``). This is the frame-classification setting of hybrid (HMM/NN) speech
recognition: the network estimates the posterior of the HMM state aligned to one frame from the
frames around it, and the decoder turns posteriors into words. The IBM BLSTM of [1]_ is trained on
non-overlapping 21-frame subsequences; scoring only the centre frame keeps every model here on
one contract (one label per window), so the data sampler and the drivers do not depend on the
architecture.

Models
------
:class:`BLSTMAcousticModel`
    IBM Interspeech 2019 [1]_: 6 bidirectional LSTM layers of 512 cells per direction over a
    21-frame window, a linear projection 1024 -> 256 and a softmax layer over 32,000 CD-HMM
    states. With PyTorch's two bias vectors per gate this is exactly 43,154,944 parameters
    (43,130,368 with one bias per gate; ALGORITHMS §D.4).
:class:`DNNAcousticModel`
    Li et al. [2]_: 6 hidden ReLU layers of 1024 units over an 11-frame context of 120-dim
    features (40 FBANK + Δ + ΔΔ = 1320 inputs), 5723 tied states.
:class:`CLDNNAcousticModel`
    Li et al. [2]_: 1 convolutional layer (128 maps), 2 LSTM layers (1024 cells, 512 projection),
    2 DNN layers (1024), in the order of Sainath et al. [3]_ (see the class docstring).

Registry
--------
:data:`MODEL_NAMES` and :func:`build_model` give the presets ``blstm``, ``blstm-small``,
``tiny-blstm``, ``dnn``, ``dnn-small`` and ``cldnn``.

The flat parameter and gradient buffers that the runtime trains these models on are
:mod:`psgdlab.runtime.loop.flat`'s.

References
----------
.. [1] W. Zhang, X. Cui, U. Finkler, G. Saon, A. Kayi, A. Buyuktosunoglu, B. Kingsbury, D. Kung,
   M. Picheny, "A highly efficient distributed deep learning system for automatic speech
   recognition", Interspeech 2019.
.. [2] Li et al., "Empirical evaluation of parallel training algorithms on acoustic modeling",
   Interspeech 2017 (LibriSpeech, Kaldi + OpenMPI).
.. [3] T. N. Sainath, O. Vinyals, A. Senior, H. Sak, "Convolutional, long short-term memory,
   fully connected deep neural networks", ICASSP 2015.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from psgdlab.core.config import unknown
from psgdlab.core.errors import ConfigError, require

__all__ = [
    "BLSTMAcousticModel",
    "DNNAcousticModel",
    "CLDNNAcousticModel",
    "MODEL_NAMES",
    "ModelPreset",
    "MODEL_PRESETS",
    "build_model",
    "count_parameters",
]


def _check_window(window: int) -> None:
    require(
        isinstance(window, int) and window >= 1 and window % 2 == 1,
        "window",
        window,
        "must be an odd positive integer (the label is the centre frame's)",
        hint="the IBM setup uses 21",
    )


def _check_positive(name: str, value: int) -> None:
    require(isinstance(value, int) and value >= 1, name, value, "must be a positive integer")


class BLSTMAcousticModel(nn.Module):
    r"""Stacked bidirectional LSTM over a frame window; classifies the centre frame.

    .. math::

        h_{1:W} = \mathrm{BLSTM}_L(x_{1:W}), \qquad
        z = P\,h_{c} + p, \qquad
        \mathrm{logits} = V z + v, \qquad c = \lfloor W/2 \rfloor,

    where :math:`h_t \in \mathbb{R}^{2H}` concatenates both directions, :math:`P` is the linear
    (no non-linearity) projection :math:`2H \to` ``projection`` and :math:`V` the softmax layer.
    The softmax itself is left to the loss (``nn.CrossEntropyLoss``).

    Parameters
    ----------
    input_dim : int
        Features per frame (IBM: FMLLR 40 + i-vector 100 + log-mel 40 with Δ, ΔΔ = 260).
    hidden_per_direction : int
        LSTM cells per direction (IBM: 512, i.e. 1024 per layer).
    layers : int
        Stacked bidirectional layers (IBM: 6).
    projection : int
        Width of the linear projection after the last layer (IBM: 256).
    n_classes : int
        Output classes (IBM: 32,000 CD-HMM states).
    window : int
        Frames per input window, odd (IBM: 21).
    dropout : float
        Dropout between LSTM layers and before the projection (0 in the papers; a regulariser
        for small corpora).

    Notes
    -----
    Parameter count (PyTorch keeps two bias vectors, ``b_ih`` and ``b_hh``, per gate):

    .. math::

        2\sum_{l=1}^{L} \bigl(4H(d_l + H) + 8H\bigr) + (2H+1)\,p + (p+1)\,K,
        \qquad d_1 = \text{input\_dim},\ d_{l>1} = 2H,

    which for the IBM sizes is 43,154,944 (ALGORITHMS §D.4).
    """

    def __init__(
        self,
        input_dim: int = 260,
        hidden_per_direction: int = 512,
        layers: int = 6,
        projection: int = 256,
        n_classes: int = 32000,
        window: int = 21,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        for name, value in (
            ("input_dim", input_dim),
            ("hidden_per_direction", hidden_per_direction),
            ("layers", layers),
            ("projection", projection),
            ("n_classes", n_classes),
        ):
            _check_positive(name, value)
        _check_window(window)
        require(0.0 <= dropout < 1.0, "dropout", dropout, "must lie in [0, 1)")
        self.input_dim, self.window, self.n_classes = input_dim, window, n_classes
        self.lstm = nn.LSTM(
            input_dim,
            hidden_per_direction,
            num_layers=layers,
            batch_first=True,
            bidirectional=True,
            dropout=dropout if layers > 1 else 0.0,
        )
        self.dropout = nn.Dropout(dropout)
        self.projection = nn.Linear(2 * hidden_per_direction, projection)
        self.output = nn.Linear(projection, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, n_classes)`` for the centre frame of ``x`` ``(batch, window, input_dim)``."""
        h, _ = self.lstm(x)
        return self.output(self.projection(self.dropout(h[:, h.shape[1] // 2])))


class DNNAcousticModel(nn.Module):
    r"""Feed-forward ReLU network over the centre ``context`` frames of the window.

    .. math::

        a_0 = \mathrm{vec}(x_{c-k:c+k}), \quad a_l = \max(0, W_l a_{l-1} + b_l)\ (l = 1..L),
        \quad \mathrm{logits} = W_o a_L + b_o, \qquad k = \lfloor \text{context}/2 \rfloor .

    Parameters
    ----------
    input_dim : int
        Features per frame (Li et al.: 40 FBANK + Δ + ΔΔ = 120).
    hidden : int
        Units per hidden layer (1024).
    layers : int
        Hidden layers (6).
    n_classes : int
        Tied states (5723).
    context : int
        Frames spliced into the input, odd (11, so 1320 inputs for 120-dim features).
    window : int
        Frames per input window; must be ``>= context``. Only the centre ``context`` frames are
        used, so the DNN accepts the same 21-frame windows as the BLSTM.

    Notes
    -----
    With the sizes above the count is
    :math:`1321\cdot1024 + 5\cdot1025\cdot1024 + 1025\cdot5723 = 12{,}466{,}779`. Li et al. quote
    "≈13.5 M"; that figure matches **7** hidden layers (13,516,379), so either the paper's layer
    count or its parameter count is off by one layer. We follow the stated architecture
    (6 layers) and expose ``layers`` so the other reading is one argument away.
    """

    def __init__(
        self,
        input_dim: int = 120,
        hidden: int = 1024,
        layers: int = 6,
        n_classes: int = 5723,
        context: int = 11,
        window: int | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("input_dim", input_dim), ("hidden", hidden), ("layers", layers), ("n_classes", n_classes)):
            _check_positive(name, value)
        _check_window(context)
        window = context if window is None else window
        _check_window(window)
        require(window >= context, "window", window, f"must be >= the DNN context ({context})")
        self.input_dim, self.window, self.context, self.n_classes = input_dim, window, context, n_classes
        blocks: list[nn.Module] = []
        width = input_dim * context
        for _ in range(layers):
            blocks += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        self.hidden = nn.Sequential(*blocks)
        self.output = nn.Linear(width, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, n_classes)`` for the centre frame of ``x`` ``(batch, window, input_dim)``."""
        start = (x.shape[1] - self.context) // 2
        spliced = x[:, start : start + self.context].reshape(x.shape[0], -1)
        return self.output(self.hidden(spliced))


class CLDNNAcousticModel(nn.Module):
    r"""Convolution over frequency, two projected LSTM layers over time, two ReLU layers.

    Our reading of Li et al.'s "1 CNN layer (128 maps), 2 DNN layers (1024), 2 LSTM layers (1024
    cells, 512 projection)", in the C-L-D order of Sainath et al. (the name CLDNN):

    1. **Conv** (per frame, along frequency): the frame's ``input_dim`` features are read as
       ``input_dim / n_bands`` channels (static, Δ, ...) of ``n_bands`` mel bands; 128 maps with a
       kernel of 8 bands, ReLU, max-pool 3 along frequency (Abdel-Hamid/Sainath style);
       40 bands -> 11 pooled bands -> 1408 values per frame.
    2. **Linear reduction** 1408 -> 256 (Sainath et al. reduce the conv output the same way
       before the LSTMs).
    3. **LSTM** x 2 over the window, 1024 cells, 512 projection (``nn.LSTM(proj_size=512)``).
    4. **DNN** x 2 on the centre frame's LSTM output, 1024 ReLU units, then the softmax layer.

    Parameters
    ----------
    input_dim : int
        Features per frame; a multiple of ``n_bands`` (Li et al.: FBANK + Δ = 80).
    n_bands : int
        Mel bands per channel (40).
    conv_maps, conv_kernel, pool : int
        Convolution maps (128), kernel width in bands (8), max-pool size (3).
    reduction : int
        Width of the linear layer between convolution and LSTM (256).
    lstm_cells, lstm_projection, lstm_layers : int
        1024, 512, 2.
    dnn_hidden, dnn_layers : int
        1024, 2.
    n_classes : int
        5723.
    window : int
        Frames per window (odd); the LSTM runs over all of them.

    Notes
    -----
    This reading has 16,208,859 parameters at ``input_dim=80``. The paper's "≈13.8 M" cannot be
    reached by any ordering of the listed blocks with 1024-cell LSTMs: the two projected LSTM
    layers alone hold ≥ 7.4 M (≥ 9.45 M when each sees a 512-dim input) and a 1024 -> 5723
    softmax 5.87 M. We keep the stated sizes and report the difference.
    """

    def __init__(
        self,
        input_dim: int = 80,
        n_classes: int = 5723,
        window: int = 21,
        *,
        n_bands: int = 40,
        conv_maps: int = 128,
        conv_kernel: int = 8,
        pool: int = 3,
        reduction: int = 256,
        lstm_cells: int = 1024,
        lstm_projection: int = 512,
        lstm_layers: int = 2,
        dnn_hidden: int = 1024,
        dnn_layers: int = 2,
    ) -> None:
        super().__init__()
        for name, value in (
            ("input_dim", input_dim),
            ("n_classes", n_classes),
            ("n_bands", n_bands),
            ("conv_maps", conv_maps),
            ("conv_kernel", conv_kernel),
            ("pool", pool),
            ("reduction", reduction),
            ("lstm_cells", lstm_cells),
            ("lstm_projection", lstm_projection),
            ("lstm_layers", lstm_layers),
            ("dnn_hidden", dnn_hidden),
            ("dnn_layers", dnn_layers),
        ):
            _check_positive(name, value)
        _check_window(window)
        require(
            input_dim % n_bands == 0,
            "input_dim",
            input_dim,
            f"must be a multiple of n_bands ({n_bands}) for the CLDNN's frequency convolution",
        )
        require(conv_kernel <= n_bands, "conv_kernel", conv_kernel, f"must be <= n_bands ({n_bands})")
        require(
            lstm_projection < lstm_cells, "lstm_projection", lstm_projection, f"must be < lstm_cells ({lstm_cells})"
        )
        self.input_dim, self.window, self.n_classes = input_dim, window, n_classes
        self.channels, self.n_bands = input_dim // n_bands, n_bands
        self.conv = nn.Sequential(nn.Conv1d(self.channels, conv_maps, conv_kernel), nn.ReLU(), nn.MaxPool1d(pool))
        pooled = (n_bands - conv_kernel + 1) // pool
        require(pooled >= 1, "pool", pool, "leaves no frequency bands after pooling")
        self.reduce = nn.Linear(conv_maps * pooled, reduction)
        self.lstm = nn.LSTM(reduction, lstm_cells, num_layers=lstm_layers, batch_first=True, proj_size=lstm_projection)
        blocks: list[nn.Module] = []
        width = lstm_projection
        for _ in range(dnn_layers):
            blocks += [nn.Linear(width, dnn_hidden), nn.ReLU()]
            width = dnn_hidden
        self.dnn = nn.Sequential(*blocks)
        self.output = nn.Linear(width, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, n_classes)`` for the centre frame of ``x`` ``(batch, window, input_dim)``."""
        batch, window, _ = x.shape
        bands = x.reshape(batch * window, self.channels, self.n_bands)
        conv = self.conv(bands).reshape(batch, window, -1)
        h, _ = self.lstm(self.reduce(conv))
        return self.output(self.dnn(h[:, window // 2]))


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelPreset:
    """A named model: a builder plus the paper's defaults for the data-dependent sizes.

    ``input_dim``/``n_classes``/``window`` of ``None`` mean "must come from the data".
    """

    builder: Callable[..., nn.Module]
    description: str
    input_dim: int | None = None
    n_classes: int | None = None
    window: int | None = 21


def _blstm(**sizes: Any) -> Callable[..., nn.Module]:
    return lambda *, input_dim, n_classes, window, **options: BLSTMAcousticModel(
        input_dim=input_dim, n_classes=n_classes, window=window, **(sizes | options)
    )


def _dnn(**sizes: Any) -> Callable[..., nn.Module]:
    def build(*, input_dim: int, n_classes: int, window: int, **options: Any) -> nn.Module:
        merged = sizes | options
        merged["context"] = min(merged["context"], window)
        return DNNAcousticModel(input_dim=input_dim, n_classes=n_classes, window=window, **merged)

    return build


def _cldnn(*, input_dim: int, n_classes: int, window: int, **options: Any) -> nn.Module:
    return CLDNNAcousticModel(input_dim=input_dim, n_classes=n_classes, window=window, **options)


MODEL_PRESETS: dict[str, ModelPreset] = {
    "blstm": ModelPreset(
        builder=_blstm(hidden_per_direction=512, layers=6, projection=256),
        description="IBM BLSTM: 6 x 512/direction, projection 256 (43,154,944 params at 260 -> 32000)",
        input_dim=260,
        n_classes=32000,
        window=21,
    ),
    "blstm-small": ModelPreset(
        builder=_blstm(hidden_per_direction=256, layers=2, projection=128),
        description="CPU-sized BLSTM: 2 x 256/direction, projection 128 (about 2.4 M params)",
    ),
    "tiny-blstm": ModelPreset(
        builder=_blstm(hidden_per_direction=32, layers=1, projection=32),
        description="test-sized BLSTM: 1 x 32/direction, projection 32 (tens of thousands of params)",
    ),
    "dnn": ModelPreset(
        builder=_dnn(hidden=1024, layers=6, context=11),
        description="Li et al. DNN: 11 frames x 120, 6 x 1024 ReLU, 5723 states (12.47 M params)",
        input_dim=120,
        n_classes=5723,
        window=11,
    ),
    "dnn-small": ModelPreset(
        builder=_dnn(hidden=256, layers=3, context=11), description="CPU-sized DNN: 11-frame context, 3 x 256 ReLU"
    ),
    "cldnn": ModelPreset(
        builder=_cldnn,
        description="Li et al. CLDNN: conv 128 maps, 2 LSTM 1024/512 proj, 2 DNN 1024, 5723 states",
        input_dim=80,
        n_classes=5723,
        window=21,
    ),
}

MODEL_NAMES: tuple[str, ...] = tuple(MODEL_PRESETS)


def build_model(
    name: str, *, input_dim: int | None = None, n_classes: int | None = None, window: int | None = None, **options: Any
) -> nn.Module:
    """Build the preset ``name`` for data of ``input_dim`` features and ``n_classes`` classes.

    Parameters
    ----------
    name : str
        One of :data:`MODEL_NAMES`.
    input_dim, n_classes, window : int, optional
        Sizes that come from the data and the sampler. ``None`` takes the paper's value for the
        full-size presets (``blstm``: 260, 32000, 21; ``dnn``: 120, 5723, 11; ``cldnn``: 80, 5723,
        21) and is an error for the small presets, whose sizes must come from the data.
    **options
        Overrides of the preset's architecture, passed to the model class (for example
        ``dropout=0.2`` or ``layers=3`` for the BLSTM presets, ``layers=7`` for ``dnn``).

    Returns
    -------
    torch.nn.Module
        Maps ``(batch, window, input_dim)`` to logits ``(batch, n_classes)``.

    Raises
    ------
    ConfigError
        Unknown name (the message lists the known names and the closest one), a size missing
        or invalid, or an option the model class does not take.

    Examples
    --------
    >>> count_parameters(build_model("blstm"))
    43154944
    """
    preset = MODEL_PRESETS.get(name)
    if preset is None:
        raise unknown("model", name, MODEL_NAMES)
    sizes = {"input_dim": input_dim, "n_classes": n_classes, "window": window}
    for key, value in sizes.items():
        if value is None:
            sizes[key] = getattr(preset, key)
        require(sizes[key] is not None, key, None, f"must be given for model {name!r} (it comes from the data)")
    try:
        return preset.builder(**sizes, **options)
    except TypeError as exc:
        if not options:
            raise
        raise ConfigError(f"model {name!r} does not take option(s) {sorted(options)}: {exc}") from exc


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters of ``model`` (trainable or not), counting shared ones once."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
