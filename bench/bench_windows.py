"""Windows per second that WindowSampler draws from an HDF5 corpus (default: the FSDD import).

Prints the load time and the rate of random 21-frame windows (batch 128) as training would draw
them: gather from the in-memory float32 matrix plus conversion to torch tensors. Builds the
FSDD corpus first when ``--data`` does not exist.

    PYTHONPATH=$PWD python bench/bench_windows.py [--data runs/fsdd.h5] [--seconds 5]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _default_fsdd() -> Path:
    """$PSGDLAB_FSDD, else shared/data/fsdd beside the checkout or beside its parent folder."""
    if os.environ.get("PSGDLAB_FSDD"):
        return Path(os.environ["PSGDLAB_FSDD"])
    candidates = [REPO.parent / "shared" / "data" / "fsdd", REPO.parent.parent / "shared" / "data" / "fsdd"]
    return next((c for c in candidates if c.is_dir()), candidates[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=REPO / "runs" / "fsdd.h5")
    parser.add_argument("--fsdd", type=Path, default=_default_fsdd())
    parser.add_argument("--window", type=int, default=21)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--world-size", type=int, default=1)
    args = parser.parse_args()

    import torch

    from psgdlab.models.batches import WindowSampler
    from psgdlab.models.data import load_corpus
    from psgdlab.models.speech import import_fsdd

    torch.set_num_threads(1)
    if not args.data.exists():
        args.data.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        import_fsdd(args.fsdd, args.data, progress=False)
        print(f"imported FSDD in {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()
    corpus = load_corpus(args.data)
    print(
        f"loaded {corpus.n_utterances} utterances, {corpus.n_frames} frames x {corpus.input_dim} "
        f"dims (deltas + CMVN) in {time.perf_counter() - start:.2f} s"
    )
    sampler = WindowSampler(corpus, window=args.window, batch=args.batch, rank=0, world_size=args.world_size)
    sampler.sample(0)
    steps, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < args.seconds:
        sampler.sample(steps)
        steps += 1
    windows = steps * args.batch
    print(
        f"{windows / elapsed:,.0f} random {args.window}-frame windows/s "
        f"({steps / elapsed:,.0f} batches of {args.batch}/s, "
        f"{windows * args.window * corpus.input_dim * 4 / elapsed / 1e6:,.0f} MB/s of float32)"
    )


if __name__ == "__main__":
    main()
