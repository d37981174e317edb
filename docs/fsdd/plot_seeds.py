"""Plot held-out WER per epoch of the seed study in ``docs/fsdd/runs.json`` to ``wer_seeds.png``.

Usage::

    PYTHONPATH=. python docs/fsdd/plot_seeds.py

One line per run (sgd seeds 0-2, AD-PSGD and H-ADPSGD seeds 0-2 scored as the mean of the four
workers' models; lr 0.2 -> 0.02 exp, total batch 32), and the mean over seeds in bold.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

HERE = Path(__file__).parent
GROUPS = {
    "sgd, 1 x 32": ["sgd-b32-exp0.2-m0.9", "sgd-b32-exp0.2-m0.9-seed1", "sgd-b32-exp0.2-m0.9-seed2"],
    "adpsgd, 4 x 8": [f"adpsgd4-b8-exp0.2-m0.9-seed{s}-mean" for s in range(3)],
    "hadpsgd, 2 nodes x 2 x 8": [f"hadpsgd4x2-b8-exp0.2-m0.9-seed{s}-mean" for s in range(3)],
}


def main() -> None:
    runs = json.loads((HERE / "runs.json").read_text())["runs"]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for (label, names), colour in zip(GROUPS.items(), ("C0", "C1", "C2")):
        curves = [[100 * e["wer"] for e in runs[n]["held_out"]] for n in names if n in runs]
        for c in curves:
            ax.plot(range(1, len(c) + 1), c, color=colour, alpha=0.35, lw=1)
        mean = np.mean(curves, axis=0)
        ax.plot(
            range(1, len(mean) + 1),
            mean,
            color=colour,
            lw=2.5,
            label=f"{label} (mean of {len(curves)} seeds: {mean[-1]:.1f} %)",
        )
    ax.axhline(15, color="grey", ls="--", lw=1)
    ax.set_xticks(range(1, 6))
    ax.set_xlabel("epoch")
    ax.set_ylabel("held-out WER (%), theo + george")
    ax.set_title("FSDD, blstm-small, lr 0.2 -> 0.02 exp, total batch 32")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(HERE / "wer_seeds.png", dpi=110)


if __name__ == "__main__":
    main()
