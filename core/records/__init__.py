"""What every executor writes and reads: traces, typed results, rows, summaries, run directories.

- :mod:`~psgdlab.core.records.trace`: the one trace schema and its summary;
- :mod:`~psgdlab.core.records.results`: typed results, their JSON round trip and schema version;
- :mod:`~psgdlab.core.records.intervals`: prediction intervals from a profile's uncertainty;
- :mod:`~psgdlab.core.records.rows`: a prediction's row and its parts;
- :mod:`~psgdlab.core.records.summaries`: the summaries of a sweep and a plan;
- :mod:`~psgdlab.core.records.rundir`: the run directory, and the one writer of its summary.

Files are written through :mod:`~psgdlab.core.files`.
"""
