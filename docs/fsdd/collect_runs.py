"""Add finished ``psgdlab train`` runs on FSDD to ``docs/fsdd/runs.json`` (written atomically).

Usage::

    PYTHONPATH=. python docs/fsdd/collect_runs.py NAME=RUN_DIR [NAME=RUN_DIR ...]

Each entry keeps the command's settings, the held-out figures after every epoch (the
``held_out`` list of ``summary.json``), which model was scored, the mean minibatch training loss
per epoch (mean over the workers' records of the epoch's steps, from ``trace.npz``), wall time,
samples/s, mean staleness and the communication fraction.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from psgdlab.core.records.trace import PHASES, atomic_write_json, read_trace

RUNS_JSON = Path(__file__).with_name("runs.json")
COMMAND_KEYS = (
    "algorithm",
    "workers",
    "gpus_per_node",
    "batch",
    "lr",
    "lr_schedule",
    "lr_final",
    "momentum",
    "seed",
    "epochs",
)


def entry(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    train = json.loads((run_dir / "config.resolved.json").read_text())["train"]
    trace, _ = read_trace(run_dir / "trace.npz")
    comp = trace[trace["phase"] == PHASES["compute"]]
    epochs = float(train["epochs"])
    steps = int(summary["steps_per_worker"])
    per_epoch = max(1, round(steps / epochs))
    losses = [
        float(np.mean(comp["loss"][(comp["step"] >= e * per_epoch) & (comp["step"] < (e + 1) * per_epoch)]))
        for e in range(round(epochs))
    ]
    keep = ("frame_accuracy", "loss", "score_s", "step", "wer", "wer_by_speaker", "wer_viterbi", "wer_vote")
    return {
        "command": {k: train.get(k) for k in COMMAND_KEYS},
        "held_out": [{k: e[k] for k in keep if k in e} for e in summary["held_out"]],
        "held_out_model": summary.get("held_out_model", "rank 0"),
        "train_loss_per_epoch": [round(x, 4) for x in losses],
        "wall_s": round(float(summary["wall_s"]), 1),
        "samples_per_s": round(float(summary["samples_per_s"]), 1),
        "staleness_mean": round(float(summary.get("staleness_mean") or 0.0), 2),
        "comm_fraction": round(float(summary.get("comm_fraction") or 0.0), 3),
    }


def main(argv: list[str]) -> int:
    if not argv or any("=" not in a for a in argv):
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print("usage: collect_runs.py NAME=RUN_DIR [NAME=RUN_DIR ...]", file=sys.stderr)
        return 2
    data = json.loads(RUNS_JSON.read_text())
    for arg in argv:
        name, run_dir = arg.split("=", 1)
        data["runs"][name] = entry(Path(run_dir))
        print(f"{name}: WER {[e['wer'] for e in data['runs'][name]['held_out']]}")
    atomic_write_json(RUNS_JSON, data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
