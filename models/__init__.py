"""What both the trainer and the emulator use: torch models, speech data, the front end, scoring,
model recipes and torch replicas; no transport, no launcher.

- :mod:`~psgdlab.models.networks`: the acoustic models of the papers (BiLSTM, DNN, CLDNN) and
  their presets;
- :mod:`~psgdlab.models.recipes`: how each model is trained when the flags do not say (no torch);
- :mod:`~psgdlab.models.data` (HDF5 corpora, no torch), :mod:`~psgdlab.models.batches` (training
  windows and evaluation batches), :mod:`~psgdlab.models.frontend` (log-mel features),
  :mod:`~psgdlab.models.speech` (the FSDD and Kaldi importers);
- :mod:`~psgdlab.models.scoring`: frame accuracy, words from frame posteriors, word error rate;
- :mod:`~psgdlab.models.replicas`: the emulator's torch replicas.

Imports :mod:`psgdlab.core`, torch, h5py, kaldiio, jiwer, numpy and scipy; never the runtime,
the simulator or the analysis (``tests/test_layering.py``). :mod:`psgdlab.runtime` trains these
models over real transports; ``psgdlab emulate`` replays a simulated trace on their replicas.
"""
