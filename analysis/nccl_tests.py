r"""nccl-tests output as calibration input: read it, fit the links' laws, write them into a profile.

NVIDIA's nccl-tests (``all_reduce_perf``, ``sendrecv_perf``, ``all_gather_perf``,
``reduce_scatter_perf``, ...) print, per run, the ranks they ran on
(``#  Rank  0 Group  0 Pid 1234 on node-a device  0 [0000:07:00] NVIDIA H100 80GB HBM3``) and a
table of message sizes with the out-of-place and in-place time (microseconds), algorithm
bandwidth :math:`S/t` and bus bandwidth (GB/s). :func:`read_nccl_tests` reads one file of it
(:class:`NcclTestsLog`); :func:`fit_nccl_tests` fits latency and bandwidth laws to the
out-of-place times of several; :func:`nccl_profile` writes them into a base profile.

**Which test a file holds**: the ``# Collective test starting: all_reduce_perf`` line of recent
versions, else a line that names the binary (a command line kept in the log), else the file's
name (``all_reduce_2nodes.log``), else the ratio of bus to algorithm bandwidth and the reduction
operation where they tell the tests apart. Every row with an algorithm bandwidth of at least
1 GB/s (printed to two decimals) is held to nccl-tests' conventions, which check the test, the
ranks and the time's unit: ``algbw`` is :math:`S/t` and ``busbw`` is ``algbw`` times
:math:`2(n-1)/n` (allreduce, :func:`psgdlab.core.platform.cost.allreduce_bytes` per byte), :math:`(n-1)/n`
(allgather, reduce-scatter) or 1 (sendrecv). ``alltoall_perf`` and the rooted tests are refused:
no algorithm here exchanges that way.

**The laws** (:mod:`psgdlab.core.platform.cost`, read backwards as the run calibration does): an
allreduce over :math:`n` ranks takes :math:`R(n)\alpha + 2(n-1)/n \cdot S/\beta`
(:func:`~psgdlab.core.platform.cost.allreduce_terms`, the base profile's schedule), an allgather or a
reduce-scatter half of it (:func:`~psgdlab.core.platform.cost.allgather_terms`), a sendrecv
:math:`\alpha + S/\beta` (:func:`~psgdlab.core.platform.cost.transfer_terms`). The files are grouped by
kind (collective, point to point) and scope (one node, several), and each group is one weighted
least-squares fit (:func:`psgdlab.analysis.fits.fit_link`, relative errors of
:data:`psgdlab.core.stats.priors.NCCL_TESTS_CV`, the spread scaled up by the residuals where they
scatter more): :math:`\beta` is the bus bandwidth the large sizes approach, :math:`\alpha` the
latency (per round for a collective) the small ones show.

**Into the profile** (:func:`nccl_profile`): the collective inside a node is
``platform.collective``, the point-to-point link inside a node ``platform.nvlink`` (``pcie``
without NVLink), the point-to-point link between nodes ``platform.nic`` and the collective
between nodes ``platform.collective_between_hosts``; each measured link has efficiency 1.
Between nodes the simulator adds the two ends' latency (:attr:`Platform.ends_latency_s
<psgdlab.core.platform.profile.Platform.ends_latency_s>`) to the link's, so the link gets the fitted
latency less that. Each value is tagged ``[NCCL-TESTS]`` with the files it came from, and its
log-sd (and the correlation of a link's two) replaces the base's spread of that link in
``[uncertainty]``.

Examples
--------
>>> import tempfile, pathlib
>>> log = pathlib.Path(tempfile.mkdtemp()) / "out.txt"
>>> _ = log.write_text('''# Collective test starting: sendrecv_perf
... #  Rank  0 Group  0 Pid 11 on node-a device  0 [0000:07:00] NVIDIA H100 80GB HBM3
... #  Rank  1 Group  0 Pid 12 on node-b device  0 [0000:07:00] NVIDIA H100 80GB HBM3
... #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
... #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
...      1048576        262144     float     sum      -1    52.94   19.81   19.81      0    52.80   19.86   19.86      0
... ''')
>>> r = read_nccl_tests(log)
>>> r.test, r.ranks, r.nodes, r.sizes_bytes, r.times_s
('sendrecv', 2, 2, (1048576,), (5.294e-05,))
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from psgdlab.analysis.fits import fit_link
from psgdlab.core.errors import ConfigError
from psgdlab.core.platform.cost import allgather_terms, allreduce_bytes, allreduce_terms, transfer_terms
from psgdlab.core.platform.profile import Link, Platform, Profile, Uncertainty
from psgdlab.core.stats.priors import NCCL_TESTS_CV

__all__ = ["TESTS", "NcclTestsLog", "bus_factor", "read_nccl_tests", "fit_nccl_tests", "nccl_profile", "LAWS"]

#: the tests read, and what each measures: a collective or a point-to-point exchange
TESTS = {"all_reduce": "collective", "all_gather": "collective", "reduce_scatter": "collective", "sendrecv": "p2p"}
#: nccl-tests' other tests: no algorithm here exchanges as they do
_OTHERS = ("alltoall", "broadcast", "reduce", "gather", "scatter", "hypercube")

#: (kind, between nodes) -> the key of the fit, the profile's link it becomes (``None``: NVLink, or
#: PCIe without it) and what it is
LAWS: dict[tuple[str, bool], tuple[str, str | None, str]] = {
    ("collective", False): ("collective", "collective", "allreduce inside a node"),
    ("p2p", False): ("link", None, "point to point inside a node"),
    ("p2p", True): ("nic", "nic", "point to point between nodes"),
    ("collective", True): ("collective_between_hosts", "collective_between_hosts", "allreduce between nodes"),
}

_PREFIX = re.compile(r"^(\[\d+,\d+\]<std(?:out|err)>:|\d+: )")  # mpirun --tag-output, srun --label
_STARTING = re.compile(r"^Collective test starting:\s*(\S+)")
_RANK = re.compile(
    r"^Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s*(?:\[[^\]]*\])?\s*(.*)$"
)
_BINARY = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join([*TESTS, *_OTHERS]) + r")_perf")
_SIZE, _TIME = ("size", "bytes"), "time"


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclTestsLog:
    """One nccl-tests run as :func:`read_nccl_tests` read it: the file, the test (``all_reduce``,
    ``all_gather``, ``reduce_scatter``, ``sendrecv``), its ranks and the nodes they ran on (the
    most ranks on one node, the device rank 0 named) and, per size of more than 0 bytes, the
    out-of-place time in seconds."""

    path: str
    test: str
    ranks: int
    nodes: int
    ranks_per_node: int
    device: str
    sizes_bytes: tuple[int, ...]
    times_s: tuple[float, ...]

    @property
    def kind(self) -> str:
        """``"collective"`` or ``"p2p"``."""
        return TESTS[self.test]

    @property
    def between_nodes(self) -> bool:
        return self.nodes > 1


def bus_factor(test: str, ranks: int) -> float:
    """nccl-tests' bus bandwidth over its algorithm bandwidth for ``test`` over ``ranks`` ranks
    (its doc/PERFORMANCE.md): :math:`2(n-1)/n` for an allreduce, :math:`(n-1)/n` for an allgather,
    a reduce-scatter or an alltoall, 1 for the others.

    >>> bus_factor("all_reduce", 8), bus_factor("all_gather", 8), bus_factor("sendrecv", 8)
    (1.75, 0.875, 1.0)
    """
    if test == "all_reduce":
        return float(allreduce_bytes(ranks, 1.0))
    if test in ("all_gather", "reduce_scatter", "alltoall"):
        return float(allreduce_bytes(ranks, 1.0)) / 2
    return 1.0


def _refuse(path: Any, number: int, line: str, why: str) -> ConfigError:
    """The one-line error of a line that cannot be read: the file, the line number and the line."""
    return ConfigError(f"{path}: line {number}: {line.strip()!r}: {why}")


@dataclass(slots=True)
class _Table:
    """What the reading has found so far."""

    header: list[str] | None = None
    header_at: int = 0
    unit_s: float = 1e-6
    rows: list[tuple[int, str, list[str]]] = dataclasses.field(default_factory=list)
    ranks: dict[int, tuple[str, str]] = dataclasses.field(default_factory=dict)
    named: tuple[str, int, str] | None = None  # test, line number, line
    mentioned: tuple[str, int, str] | None = None


def read_nccl_tests(path: str | Path) -> NcclTestsLog:
    """Read one nccl-tests output file (module docstring). A file that is not nccl-tests output,
    holds a test that is not read, breaks nccl-tests' conventions, or lists a rank twice (a build
    without ``MPI=1`` started by ``mpirun`` runs one test per process) is refused in one line that
    names the file, the line and why (:class:`~psgdlab.core.errors.ConfigError`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"nccl-tests output {path} does not exist")
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    table = _Table()
    for number, raw in enumerate(lines, 1):
        _read_line(path, table, number, raw)
    first = next(((i, x) for i, x in enumerate(lines, 1) if x.strip()), (1, ""))
    if table.header is None:
        raise _refuse(path, *first, "not nccl-tests output: no '#  size  count  type ... time  algbw  busbw' header")
    at, header_line = table.header_at, lines[table.header_at - 1]
    if not table.rows:
        raise _refuse(path, at, header_line, "no result rows follow the column header")
    if not table.ranks:
        raise _refuse(
            path, at, header_line, "no '#  Rank N ... on HOST device D' lines before it: its ranks and nodes unknown"
        )
    n = len(table.ranks)
    if sorted(table.ranks) != list(range(n)):
        raise _refuse(path, at, header_line, f"the ranks listed before it are {sorted(table.ranks)}, not 0 to {n - 1}")
    test = _test_of(path, table, n)
    columns = {name: table.header.index(name) for name in table.header}  # the first of a repeated name: out-of-place
    size_col = columns["size"] if "size" in columns else columns["bytes"]
    sizes, times = [], []
    for number, raw, cells in table.rows:
        size, time_s = _check_row(path, number, raw, cells, columns, size_col, table.unit_s, test, n)
        if size > 0:
            sizes.append(size)
            times.append(time_s)
    per_node = Counter(host for host, _ in table.ranks.values())
    return NcclTestsLog(
        path=str(path),
        test=test,
        ranks=n,
        nodes=len(per_node),
        ranks_per_node=max(per_node.values()),
        device=table.ranks[0][1],
        sizes_bytes=tuple(sizes),
        times_s=tuple(times),
    )


def _read_line(path: Path, table: _Table, number: int, raw: str) -> None:
    """One line into ``table``: a rank, the test's name, the header and its units, a row."""
    line = _PREFIX.sub("", raw.rstrip("\r"), count=1).strip()
    if not line:
        return
    if line.startswith("#"):
        body = line[1:].strip()
        if m := _STARTING.match(body):
            test = re.sub(r"_perf.*$", "", m.group(1).rsplit("/", 1)[-1])
            if table.named is not None and table.named[0] != test:
                first = f"{table.named[0]} began at line {table.named[1]}"
                raise _refuse(path, number, raw, f"a second test begins ({first}): give each run in a file of its own")
            table.named = (test, number, raw)
        elif m := _RANK.match(body):
            rank = int(m.group(1))
            if rank in table.ranks:
                raise _refuse(
                    path,
                    number,
                    raw,
                    f"rank {rank} is listed twice: each process ran a test of its own (nccl-tests built "
                    "without MPI=1 under mpirun); rebuild with MPI=1",
                )
            table.ranks[rank] = (m.group(2), m.group(3).strip())
        elif (tokens := body.split()) and tokens[0] in _SIZE and _TIME in tokens:
            if table.header is not None:
                raise _refuse(
                    path,
                    number,
                    raw,
                    f"a second result table begins (the first at line {table.header_at}): "
                    "give each run in a file of its own",
                )
            table.header, table.header_at = tokens, number
        elif table.header is not None and body.startswith("(B)"):
            units = [t for t in body.split() if t in ("(us)", "(ms)")]
            table.unit_s = 1e-3 if units[:1] == ["(ms)"] else 1e-6
        return
    if table.mentioned is None and (m := _BINARY.search(line)):
        table.mentioned = (m.group(1), number, raw)
    tokens = line.split()
    if table.header is None or not tokens[0].isdigit():
        return  # the launcher's and NCCL's own lines before and among the rows
    if len(tokens) != len(table.header):
        columns = f"{len(tokens)} columns where the header (line {table.header_at}) has {len(table.header)}"
        raise _refuse(path, number, raw, columns)
    table.rows.append((number, raw, tokens))


def _test_of(path: Path, table: _Table, ranks: int) -> str:
    """The test of the file (module docstring), refused where it is not one that is read."""
    found = table.named or table.mentioned
    if found is None:
        stem = re.sub(r"[^a-z]", "", path.stem.lower())
        for test in (*TESTS, "alltoall"):
            if test.replace("_", "") in stem:
                found = (test, table.header_at, f"(the file's name) {path.name}")
                break
    if found is None:
        found = _test_by_bandwidth(path, table, ranks)
    test, number, line = found
    if test not in TESTS:
        raise _refuse(
            path,
            number,
            line,
            f"{test}_perf is a test no algorithm here exchanges by (read: {', '.join(t + '_perf' for t in TESTS)})",
        )
    return test


def _test_by_bandwidth(path: Path, table: _Table, ranks: int) -> tuple[str, int, str]:
    """The test whose bus-bandwidth factor and reduction operation the rows show, where only one
    does; else a refusal that asks for the test's name."""
    assert table.header is not None
    busbw = table.header.index("busbw") if "busbw" in table.header else None
    algbw = table.header.index("algbw") if "algbw" in table.header else None
    redop = table.header.index("redop") if "redop" in table.header else None
    number, raw, cells = table.rows[0]
    ratios = [
        float(c[busbw]) / float(c[algbw])
        for _, _, c in table.rows
        if busbw is not None and algbw is not None and _number(c[algbw]) >= 1.0
    ]
    reduces = redop is not None and cells[redop] != "none"
    fits = [
        t
        for t in (*TESTS, "alltoall")
        if ratios
        and abs(float(np.median(ratios)) - bus_factor(t, ranks)) <= 0.01 * bus_factor(t, ranks) + 0.01
        and (t == "sendrecv" or reduces == (t in ("all_reduce", "reduce_scatter")))
    ]
    if len(fits) == 1:
        return fits[0], number, raw
    said = f"could be {' or '.join(t + '_perf' for t in fits)}" if fits else "matches no test read here"
    raise _refuse(
        path,
        number,
        raw,
        f"which test wrote it is not said and its bandwidths {said}: keep nccl-tests' '# Collective test "
        "starting' line, or name the file after the test (all_reduce.log)",
    )


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _check_row(
    path: Path,
    number: int,
    raw: str,
    cells: list[str],
    columns: dict[str, int],
    size_col: int,
    unit_s: float,
    test: str,
    ranks: int,
) -> tuple[int, float]:
    """``(size, out-of-place seconds)`` of a row held to nccl-tests' conventions (module docstring);
    a row of 0 bytes (a size too small to split over the ranks) is passed over."""
    size, time = int(cells[size_col]), _number(cells[columns[_TIME]])
    if size == 0:
        return 0, 0.0
    if not (math.isfinite(time) and time > 0):
        raise _refuse(path, number, raw, f"the out-of-place time {cells[columns[_TIME]]!r} is not a positive number")
    if "algbw" not in columns or "busbw" not in columns:
        return size, time * unit_s
    algbw, busbw = _number(cells[columns["algbw"]]), _number(cells[columns["busbw"]])
    if not algbw >= 1.0:  # two printed decimals: too few digits below 1 GB/s (and nan)
        return size, time * unit_s
    expected = size / (time * unit_s) / 1e9
    if abs(algbw - expected) > 0.011 + 0.005 * algbw:
        raise _refuse(
            path,
            number,
            raw,
            f"algbw {algbw:g} GB/s is not size/time = {expected:.4g}: the time is not in the unit its header gives",
        )
    factor = bus_factor(test, ranks)
    if abs(busbw - algbw * factor) > 0.02 + 0.002 * busbw:
        raise _refuse(
            path,
            number,
            raw,
            f"busbw {busbw:g} is not algbw {algbw:g} x {factor:.4g}, {test}'s factor over {ranks} ranks: another test "
            "or another number of ranks wrote it",
        )
    return size, time * unit_s


# ----- the fit --------------------------------------------------------------------------------------
def _design(log: NcclTestsLog, algorithm: str) -> np.ndarray:
    """The rows of :math:`(\\alpha, 1/\\beta)` coefficients of ``log``'s points (its test's law)."""
    S = np.asarray(log.sizes_bytes, dtype=float)
    if log.test == "all_reduce":
        a, b = allreduce_terms(log.ranks, S, algorithm)
    elif log.kind == "collective":
        a, b = allgather_terms(log.ranks, S, algorithm)
    else:
        a, b = transfer_terms(S)
    return np.column_stack([np.broadcast_to(np.asarray(a, dtype=float), S.shape), b])


def fit_nccl_tests(
    logs: Sequence[NcclTestsLog], *, algorithm: str = "ring", algorithm_between_hosts: str | None = None
) -> dict[str, Any]:
    """The laws of ``logs`` (module docstring), one per kind and scope they measure.

    ``algorithm``: the allreduce schedule inside a node (the profile's ``allreduce``);
    ``algorithm_between_hosts``: between nodes (default ``algorithm``).

    Returns
    -------
    dict
        ``collective``, ``link``, ``nic``, ``collective_between_hosts`` (:data:`LAWS`): each
        :func:`psgdlab.analysis.fits.fit_link`'s result with the ``files`` behind it, or ``None``;
        ``nccl_tests``: one entry per log with ``file``, ``test``, ``ranks``, ``nodes``,
        ``ranks_per_node``, ``device``, ``law`` (the key of its fit), ``sizes_bytes``,
        ``measured_s`` (out-of-place) and ``fitted_s`` (the law at those sizes).
    """
    out: dict[str, Any] = {key: None for key, _, _ in LAWS.values()}
    entries: list[dict[str, Any]] = []
    for (kind, between), (key, _, what) in LAWS.items():
        group = [log for log in logs if log.kind == kind and log.between_nodes == between]
        if not group:
            continue
        schedule = (algorithm_between_hosts or algorithm) if between else algorithm
        X = np.vstack([_design(log, schedule) for log in group])
        t = np.concatenate([log.times_s for log in group])
        S = np.concatenate([log.sizes_bytes for log in group]).astype(float)
        try:
            fit = fit_link(t, S, design=X, records=t.size, sd_s=NCCL_TESTS_CV * t)
        except ConfigError as exc:
            raise ConfigError(f"{what} ({', '.join(log.path for log in group)}): {exc}") from None
        fit["files"] = [log.path for log in group]
        fit["what"] = what
        out[key] = fit
        coef = np.array([fit["latency_s"], 1.0 / fit["bandwidth_bytes_per_s"]])
        for log in group:
            entries.append(
                {
                    "file": log.path,
                    "test": log.test,
                    "ranks": log.ranks,
                    "nodes": log.nodes,
                    "ranks_per_node": log.ranks_per_node,
                    "device": log.device,
                    "law": key,
                    "sizes_bytes": list(log.sizes_bytes),
                    "measured_s": list(log.times_s),
                    "fitted_s": [float(x) for x in _design(log, schedule) @ coef],
                }
            )
    order = {log.path: i for i, log in enumerate(logs)}
    out["nccl_tests"] = sorted(entries, key=lambda e: order[e["file"]])
    return out


# ----- into a profile -----------------------------------------------------------------------------
def nccl_profile(
    base: Profile,
    fit: dict[str, Any],
    logs: Sequence[NcclTestsLog],
    *,
    name: str | None = None,
    hosts: int | None = None,
    devices: int | None = None,
) -> Profile:
    """``base`` with the laws of ``fit`` (:func:`fit_nccl_tests`) as its links (module docstring),
    their uncertainty in ``[uncertainty]``, the values tagged ``[NCCL-TESTS]`` and a note per law.
    ``hosts`` and ``devices`` (per host) resize the platform; every log must fit on it."""
    platform = base.platform
    resize = {"hosts": hosts, "devices_per_host": devices}
    per_device = platform.sockets_per_host == platform.devices_per_host  # a PCIe link per device: keep it so
    platform = dataclasses.replace(
        platform,
        hosts=hosts or platform.hosts,
        devices_per_host=devices or platform.devices_per_host,
        sockets_per_host=devices if devices and per_device else platform.sockets_per_host,
    )
    if name:
        platform = dataclasses.replace(platform, name=name)
    for log in logs:
        if log.ranks_per_node > platform.devices_per_host or log.nodes > platform.hosts:
            raise ConfigError(
                f"{log.path} ran {log.ranks_per_node} ranks per node on {log.nodes} nodes, more than the base "
                f"platform's {platform.devices_per_host} devices per host on {platform.hosts} hosts: give "
                "--workers-per-node or --platform-hosts"
            )
    provenance = dict(base.provenance)
    for key, value in resize.items():
        if value is not None:
            provenance[f"platform.{key}"] = "[INF] given to psgdlab calibrate"
    fitted: list[tuple[str, dict[str, Any], float]] = []  # (table, fit, written latency)
    for (_, between), (key, table, _) in sorted(LAWS.items(), key=lambda kv: kv[0][1]):  # inside a node first
        law = fit.get(key)
        if law is None:
            continue
        table = table or ("nvlink" if platform.nvlink is not None else "pcie")
        latency = law["latency_s"] - (platform.ends_latency_s if between else 0.0)
        link = Link(latency_s=max(latency, 0.0), bandwidth_bytes_per_s=law["bandwidth_bytes_per_s"], efficiency=1.0)
        platform = _with_link(platform, table, link)
        provenance = {k: v for k, v in provenance.items() if not _under(k, f"platform.{table}")}
        provenance.update(_tags(table, law, between, link.latency_s))
        fitted.append((table, law, link.latency_s))
    notes = (*base.notes, *_notes(fit, logs))
    profile = dataclasses.replace(base, platform=platform, provenance={}, notes=notes)
    uncertainty = _uncertainty(base.uncertainty, fitted)
    profile = dataclasses.replace(profile, uncertainty=uncertainty)
    paths = set(profile.paths())
    return dataclasses.replace(profile, provenance={k: v for k, v in provenance.items() if k in paths})


def _with_link(platform: Platform, table: str, link: Link) -> Platform:
    """``platform`` with its link class ``table`` (``nvlink``, ``nic``, ...) replaced."""
    return dataclasses.replace(platform, **{table: link})  # type: ignore[arg-type]


def _under(path: str, table: str) -> bool:
    """Whether ``path`` is ``table`` or one of its keys (``platform.collective`` is not under
    ``platform.collective_between_hosts``)."""
    return path == table or path.startswith(table + ".")


def _tags(table: str, law: dict[str, Any], between: bool, latency_s: float) -> dict[str, str]:
    """The ``[NCCL-TESTS]`` comments of a measured link."""
    files = ", ".join(Path(f).name for f in law["files"])
    lat_sd = law.get("latency_log_sd")
    lat_sd = lat_sd * law["latency_s"] / latency_s if lat_sd is not None and latency_s > 0 else None
    per = "per round" if "collective" in table else "per message"
    return {
        f"platform.{table}": f"[NCCL-TESTS] {law['what']}, fitted from {files}",
        f"platform.{table}.latency_s": f"[NCCL-TESTS] {per}"
        + (" less the ends' PCIe (the simulator adds them)" if between else "")
        + (f"; log-sd {lat_sd:.2g}" if lat_sd is not None else "; at its bound 0"),
        f"platform.{table}.bandwidth_bytes_per_s": f"[NCCL-TESTS] bus bandwidth; log-sd {law['bandwidth_log_sd']:.2g}"
        if law.get("bandwidth_log_sd") is not None
        else "[NCCL-TESTS] bus bandwidth",
        f"platform.{table}.efficiency": "[NCCL-TESTS] 1: the bandwidth is measured",
    }


def _uncertainty(base: Uncertainty | None, fitted: list[tuple[str, dict[str, Any], float]]) -> Uncertainty:
    """``base`` without the spreads of the links measured, with theirs (block-diagonal)."""
    replaced = tuple(f"platform.{table}." for table, _, _ in fitted)
    params: list[str] = []
    sds: list[float] = []
    blocks: list[list[list[float]]] = []
    unpinned: list[str] = []
    noise = 0.0
    if base is not None:
        keep = [i for i, p in enumerate(base.parameters) if not p.startswith(replaced)]
        params += [base.parameters[i] for i in keep]
        sds += [base.log_sd[i] for i in keep]
        corr = np.array(base.correlation) if base.correlation else np.eye(len(base.parameters))
        blocks.append([[float(corr[i][j]) for j in keep] for i in keep])
        unpinned += [p for p in base.unpinned if p in params]
        noise = base.noise_cv
    for table, law, latency in fitted:
        pair = []
        scaled = law["latency_log_sd"] * law["latency_s"] / latency if law["latency_log_sd"] and latency > 0 else None
        for key, sd in (("latency_s", scaled), ("bandwidth_bytes_per_s", law["bandwidth_log_sd"])):
            if sd is not None and sd > 0:
                pair.append(f"platform.{table}.{key}")
                sds.append(float(sd))
        params += pair
        r = float(np.clip(law.get("log_correlation") or 0.0, -0.999, 0.999)) if len(pair) == 2 else 0.0
        blocks.append([[1.0, r], [r, 1.0]] if len(pair) == 2 else [[1.0]] * len(pair))
    n = len(params)
    corr_full = np.eye(n)
    at = 0
    for block in blocks:
        k = len(block)
        if k:
            corr_full[at : at + k, at : at + k] = np.array(block)
        at += k
    correlated = not np.allclose(corr_full, np.eye(n))
    return Uncertainty(
        parameters=tuple(params),
        log_sd=tuple(sds),
        correlation=tuple(tuple(float(x) for x in row) for row in corr_full) if correlated else (),
        unpinned=tuple(unpinned),
        noise_cv=noise,
    )


def _notes(fit: dict[str, Any], logs: Sequence[NcclTestsLog]) -> list[str]:
    """The head-comment lines of the calibration: the files and each law's fit."""
    lines = ["Links calibrated by psgdlab calibrate --nccl-tests from:"]
    for log in logs:
        lo, hi = min(log.sizes_bytes), max(log.sizes_bytes)
        lines.append(
            f"  {log.path}: {log.test}_perf, {log.ranks} ranks on {log.nodes} node(s) ({log.device}), "
            f"{len(log.sizes_bytes)} sizes {lo}-{hi} B"
        )
    for key, _, what in LAWS.values():
        law = fit.get(key)
        if law is None:
            continue
        lines.append(
            f"  {what}: latency {law['latency_s'] * 1e6:.4g} us, bandwidth "
            f"{law['bandwidth_bytes_per_s'] / 1e9:.4g} GB/s from {law['points']} points; rms residual "
            f"{law['rms_residual_s']:.3g} s, max relative residual "
            f"{law['max_rel_residual']:.3g}"
        )
    return lines
