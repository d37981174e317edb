"""``psgdlab data``: build and inspect HDF5 speech corpora.

Subcommands::

    psgdlab data fsdd DIR --out FILE.h5 [--speed 0.9,1.0,1.1] [--json]   FSDD WAVs
    psgdlab data kaldi FEATS.scp --alignments ALI --out FILE.h5 [--classes N] [--json]
    psgdlab data synthetic --out FILE.h5 [--utterances N] [--frames F] [--dim D] [--classes K]
                           [--speakers S] [--seed SEED] [--json]
    psgdlab data info FILE.h5 [--json]

Every subcommand ends by printing the corpus summary (``--json``: one JSON object on stdout).
Bad input exits with status 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from psgdlab.commands import print_json, show_progress

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    from psgdlab.core.flags import add_flags

    parser = subparsers.add_parser(
        "data",
        help="build and inspect HDF5 speech corpora (FSDD, Kaldi, synthetic)",
        description="Build HDF5 corpora (frame features + frame labels) for training, or summarise one.",
    )
    sub = parser.add_subparsers(dest="data_command", metavar="KIND", required=True)

    fsdd = sub.add_parser("fsdd", help="import Free Spoken Digit Dataset recordings (8 kHz WAV)")
    fsdd.add_argument("directory", help="FSDD folder (holding recordings/) or the recordings folder")
    _add_output(fsdd)
    add_flags(fsdd, "--no-progress")
    fsdd.add_argument(
        "--speed",
        default="1.0",
        help="comma-separated speed-perturbation factors, e.g. 0.9,1.0,1.1 (copies count as speakers 'sp0.9-NAME')",
    )

    kaldi = sub.add_parser("kaldi", help="import Kaldi features with frame alignments (kaldiio)")
    kaldi.add_argument("feats", help="feats.scp or a feature ark")
    kaldi.add_argument("--alignments", required=True, help="text file 'utt s1 s2 ...' or an ark/scp of integer vectors")
    kaldi.add_argument("--classes", type=int, default=None, help="number of states (default: largest label + 1)")
    kaldi.add_argument(
        "--add-deltas", action="store_true", help="mark the corpus so loaders append delta and delta-delta features"
    )
    _add_output(kaldi)
    add_flags(kaldi, "--no-progress")

    synth = sub.add_parser("synthetic", help="write a learnable synthetic corpus")
    _add_output(synth)
    synth.add_argument("--utterances", type=int, default=200)
    synth.add_argument("--frames", type=int, default=100, help="mean frames per utterance")
    synth.add_argument("--dim", type=int, default=40, help="features per frame")
    synth.add_argument("--classes", type=int, default=10)
    synth.add_argument("--speakers", type=int, default=4)
    synth.add_argument("--seed", type=int, default=0)

    info = sub.add_parser("info", help="summarise a corpus file (counts, speakers, classes, dims)")
    info.add_argument("path", help="HDF5 corpus file")
    info.add_argument("--json", action="store_true", help="print one JSON object on one line on stdout")
    parser.set_defaults(func=run)


def _add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="output HDF5 file (written atomically)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object on one line")


def run(args: argparse.Namespace) -> int:
    from psgdlab.models.data import inspect_corpus

    kind = args.data_command
    if kind == "info":
        path = args.path
    elif kind == "fsdd":
        from psgdlab.models.speech import import_fsdd

        path = import_fsdd(
            args.directory, args.out, progress=show_progress(args), speed_factors=_floats(args.speed, "--speed")
        )
    elif kind == "kaldi":
        from psgdlab.models.speech import import_kaldi

        path = import_kaldi(
            args.feats,
            args.out,
            alignments=args.alignments,
            n_classes=args.classes,
            add_deltas=args.add_deltas,
            progress=show_progress(args),
        )
    else:
        from psgdlab.models.data import synthetic_corpus

        path = synthetic_corpus(
            args.out,
            n_utterances=args.utterances,
            frames_per_utt=args.frames,
            input_dim=args.dim,
            n_classes=args.classes,
            n_speakers=args.speakers,
            seed=args.seed,
        )
    summary = inspect_corpus(path)
    if args.json:
        print_json(summary)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(_format(summary))
    return 0


def _floats(text: str, option: str) -> list[float]:
    from psgdlab.core.errors import ConfigError

    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"{option} ({text!r}) must be comma-separated numbers, e.g. 0.9,1.0,1.1") from None


def _format(s: dict[str, Any]) -> str:
    speakers = ", ".join(f"{name} ({n})" for name, n in s["speakers"].items())
    lines = [
        f"corpus        {s['path']}",
        f"utterances    {s['n_utterances']}",
        f"frames        {s['n_frames']} ({s['duration_s']:.1f} s at {s['frame_shift_s'] * 1000:g} ms)",
        f"features      {s['feature_dim']} x {s['feature_dtype']} ({s['feature_kind']}); "
        f"model input {s['input_dim']}" + (" with delta, delta-delta" if s["add_deltas"] else ""),
        f"classes       {s['n_classes']} ({s['classes_present']} present)",
        f"speakers      {s['n_speakers']}: {speakers}",
    ]
    if s["credit"]:
        lines.append(f"credit        {s['credit']}")
    return "\n".join(lines) + "\n"
