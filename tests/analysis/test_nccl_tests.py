"""nccl-tests output as calibration input (analysis.nccl_tests, psgdlab calibrate --nccl-tests):
logs written from a known law are fitted back, real output parses, anything else is refused in one
line, and the profile written prices on the simulator what the logs measured."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psgdlab.analysis.nccl_tests import bus_factor, fit_nccl_tests, nccl_profile, read_nccl_tests
from psgdlab.cli import main
from psgdlab.core.errors import ConfigError
from psgdlab.core.platform.cost import allgather_s, allreduce_s, transfer_s
from psgdlab.sim.network import Network
from psgdlab.sim.platform import Placement
from psgdlab.sim.workload import load_config

DATA = Path(__file__).parent / "data"
GIB = 1 << 30

#: the law each test is written from: latency (per round for a collective) and bus bandwidth
INSIDE = {"all_reduce": (1.2e-6, 3.6e11), "sendrecv": (4e-6, 3.7e11)}
BETWEEN = {"all_reduce": (6e-6, 3.4e11), "sendrecv": (9e-6, 4.7e10)}


def _time_text(us: float) -> str:
    """nccl-tests' time column: 2 decimals below 100 us, 1 below 10 ms, none above."""
    return f"{us:7.0f}" if us >= 1e4 else f"{us:7.1f}" if us >= 100 else f"{us:7.2f}"


def nccl_log(test, hosts, per_host, alpha, beta, *, noise=0.0, seed=0, name=True, device="NVIDIA H100 80GB HBM3"):
    """The text ``test``_perf prints for ``hosts`` x ``per_host`` ranks, sizes 8 B to 1 GiB by
    factors of 2 (``-b 8 -e 1G -f 2``), whose out-of-place times follow the law of ``alpha`` and
    ``beta`` times a log-normal factor of sd ``noise``; ``name``: with the line that names the test."""
    rng = np.random.default_rng(seed)
    n = hosts * per_host
    lines = [f"# Collective test starting: {test}_perf"] if name else []
    lines += [
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 "
        "validation: 1 graph: 0",
        "#",
        "# Using devices",
    ]
    for r in range(n):
        lines.append(
            f"#  Rank {r:2d} Group  0 Pid {1000 + r:6d} on {f'node-{r // per_host}':>10} device {r % per_host:2d} "
            f"[0000:{r:02x}:00] {device}"
        )
    lines += [
        "#",
        "#                                                              out-of-place                       in-place",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw "
        "#wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)",
    ]
    size = 8
    while size <= GIB:
        count, total, redop = size // 4, size, "sum"
        if test in ("all_gather", "reduce_scatter"):  # a whole number of 16-byte blocks per rank
            count = (size // 4 // n) & ~3
            total, redop = count * 4 * n, "none" if test == "all_gather" else "sum"
        if test == "all_reduce":
            t = allreduce_s(n, total, beta, alpha)
        elif test == "sendrecv":
            t = transfer_s(total, beta, alpha)
        else:
            t = allgather_s(n, total, beta, alpha)
        t *= float(np.exp(rng.normal(0.0, noise)))
        algbw = total / t / 1e9
        cells = f"  {_time_text(t * 1e6)}  {algbw:6.2f}  {algbw * bus_factor(test, n):6.2f}  {0:5d}"
        lines.append(f"{total:12d}  {count:12d}  {'float':>8}  {redop:>6}  {-1:6d}{cells}{cells}")
        size *= 2
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 0.0", "#"]
    return "\n".join(lines) + "\n"


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture
def cluster_logs(tmp_path):
    """One node of 8 and two nodes of 8 (allreduce, allgather, reduce-scatter) and pairs of GPUs
    inside a node and across two (sendrecv), each with 2 % noise."""
    logs = {
        "ar1": nccl_log("all_reduce", 1, 8, *INSIDE["all_reduce"], noise=0.02, seed=1),
        "sr1": nccl_log("sendrecv", 1, 2, *INSIDE["sendrecv"], noise=0.02, seed=2),
        "ar2": nccl_log("all_reduce", 2, 8, *BETWEEN["all_reduce"], noise=0.02, seed=3),
        "ag2": nccl_log("all_gather", 2, 8, *BETWEEN["all_reduce"], noise=0.02, seed=4),
        "rs2": nccl_log("reduce_scatter", 2, 8, *BETWEEN["all_reduce"], noise=0.02, seed=5),
        "sr2": nccl_log("sendrecv", 2, 1, *BETWEEN["sendrecv"], noise=0.02, seed=6),
    }
    return {key: _write(tmp_path, f"{key}.log", text) for key, text in logs.items()}


def test_known_laws_are_fitted_back_within_5_percent(cluster_logs):
    logs = [read_nccl_tests(p) for p in cluster_logs.values()]
    assert [(x.test, x.ranks, x.nodes) for x in logs] == [
        ("all_reduce", 8, 1),
        ("sendrecv", 2, 1),
        ("all_reduce", 16, 2),
        ("all_gather", 16, 2),
        ("reduce_scatter", 16, 2),
        ("sendrecv", 2, 2),
    ]
    assert len(logs[0].sizes_bytes) == 28 and logs[0].sizes_bytes[-1] == GIB  # 8 B to 1 GiB
    fit = fit_nccl_tests(logs)
    for key, (alpha, beta) in (
        ("collective", INSIDE["all_reduce"]),
        ("link", INSIDE["sendrecv"]),
        ("collective_between_hosts", BETWEEN["all_reduce"]),
        ("nic", BETWEEN["sendrecv"]),
    ):
        law = fit[key]
        assert law["latency_s"] == pytest.approx(alpha, rel=0.05), key
        assert law["bandwidth_bytes_per_s"] == pytest.approx(beta, rel=0.05), key
        # the spreads come from the residuals: 2 % noise over 28+ points pins both to about 1 %
        assert 0.001 < law["latency_log_sd"] < 0.05 and 0.001 < law["bandwidth_log_sd"] < 0.05
    assert fit["collective_between_hosts"]["files"] == [str(cluster_logs[k]) for k in ("ar2", "ag2", "rs2")]
    for entry in fit["nccl_tests"]:
        measured, fitted = np.array(entry["measured_s"]), np.array(entry["fitted_s"])
        assert measured.size == len(entry["sizes_bytes"]) == fitted.size
        assert np.max(np.abs(fitted / measured - 1)) < 0.1  # 2 % noise: within 5 sd


@settings(max_examples=25, deadline=None)
@given(
    test=st.sampled_from(["all_reduce", "all_gather", "reduce_scatter", "sendrecv"]),
    hosts=st.integers(1, 4),
    per_host=st.sampled_from([2, 4, 8]),
    alpha=st.floats(1e-6, 1e-4),
    beta=st.floats(1e9, 1e12),
)
def test_any_law_written_exactly_is_read_and_fitted_back(tmp_path_factory, test, hosts, per_host, alpha, beta):
    """Without noise the only error is nccl-tests' printing of the times (4 significant digits):
    every row passes the conventions' checks (bus bandwidth factor, size over time) and the fit
    lands within 2 %."""
    path = _write(tmp_path_factory.mktemp("log"), "out.txt", nccl_log(test, hosts, per_host, alpha, beta))
    log = read_nccl_tests(path)
    assert (log.test, log.ranks, log.nodes, log.ranks_per_node) == (test, hosts * per_host, hosts, per_host)
    key = {(True, False): "collective", (False, False): "link", (True, True): "collective_between_hosts"}
    law = fit_nccl_tests([log])[key.get((test != "sendrecv", hosts > 1), "nic")]
    assert law["latency_s"] == pytest.approx(alpha, rel=0.02)
    assert law["bandwidth_bytes_per_s"] == pytest.approx(beta, rel=0.02)


def test_bus_factors_are_nccl_tests_conventions():
    for n in (2, 3, 8, 64):
        assert bus_factor("all_reduce", n) == pytest.approx(2 * (n - 1) / n)
        assert bus_factor("all_gather", n) == bus_factor("reduce_scatter", n) == pytest.approx((n - 1) / n)
        assert bus_factor("sendrecv", n) == 1.0


def test_real_output_parses():
    """Real output of recent nccl-tests, kept as published (data/README.md)."""
    ar = read_nccl_tests(DATA / "nccl-tests-gb10-all_reduce.txt")
    assert (ar.test, ar.ranks, ar.nodes, ar.ranks_per_node, ar.device) == ("all_reduce", 2, 2, 1, "NVIDIA GB10")
    assert ar.sizes_bytes == (8192, 16384, 32768, 65536)
    np.testing.assert_allclose(ar.times_s, [35.15e-6, 31.67e-6, 39.56e-6, 67.93e-6], rtol=1e-12)
    ag = read_nccl_tests(DATA / "nccl-tests-gb10-all_gather.txt")
    assert (ag.test, ag.ranks, ag.nodes, ag.sizes_bytes, ag.times_s) == (
        "all_gather",
        2,
        2,
        (17179869184,),
        (0.45365,),
    )


def test_the_test_is_found_without_its_name(tmp_path):
    """Older versions print no 'Collective test starting' line: the file's name, a command line
    in it, or the bandwidths (where they tell the tests apart) say which test it is."""
    text = nccl_log("all_reduce", 1, 8, 1e-6, 1e11, name=False)
    assert read_nccl_tests(_write(tmp_path, "a.txt", text)).test == "all_reduce"  # 2(n-1)/n is allreduce's
    cmd = "$ mpirun -np 8 ./build/reduce_scatter_perf -b 8 -e 1G -f 2\n"
    text = nccl_log("reduce_scatter", 1, 8, 1e-6, 1e11, name=False)
    assert read_nccl_tests(_write(tmp_path, "b.txt", cmd + text)).test == "reduce_scatter"
    text = nccl_log("sendrecv", 1, 2, 1e-6, 1e11, name=False)  # 2 ranks: an allreduce's factor is 1 too
    with pytest.raises(ConfigError, match=r"could be all_reduce_perf or sendrecv_perf.*Collective test starting"):
        read_nccl_tests(_write(tmp_path, "c.txt", text))
    assert read_nccl_tests(_write(tmp_path, "sendrecv-2gpus.txt", text)).test == "sendrecv"


def _refusal(path):
    with pytest.raises(ConfigError) as info:
        read_nccl_tests(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: line ")
    return message


def test_garbage_is_refused_in_one_line_naming_the_line(tmp_path):
    assert "line 1: 'hello, world': not nccl-tests output" in _refusal(_write(tmp_path, "a.txt", "hello, world\n"))
    csv = "size,count,type,redop,root,time,algbw,busbw\n8,2,float,sum,-1,5.1,0.0,0.0\n"
    assert "line 1: 'size,count,type" in _refusal(_write(tmp_path, "b.csv", csv))
    good = nccl_log("all_reduce", 1, 8, 1e-6, 1e11)
    lines = good.split("\n")
    row = next(i for i, x in enumerate(lines) if x.strip().startswith("1048576 "))
    broken = "\n".join([*lines[:row], lines[row] + " 7", *lines[row + 1 :]])
    message = _refusal(_write(tmp_path, "c.txt", broken))
    assert f"line {row + 1}: '1048576" in message and "14 columns where the header" in message
    no_ranks = "\n".join(x for x in lines if "Rank" not in x)
    assert "its ranks and nodes unknown" in _refusal(_write(tmp_path, "d.txt", no_ranks))


def test_another_test_or_rank_count_is_refused(tmp_path):
    text = nccl_log("alltoall", 1, 8, 1e-6, 1e11).replace("sum", "none")
    assert "line 1: '# Collective test starting: alltoall_perf': alltoall_perf is a test no algorithm" in _refusal(
        _write(tmp_path, "a.txt", text)
    )
    # the busbw of 8 ranks under the header of 4: the log is not what it says
    text = nccl_log("all_reduce", 1, 8, 1e-6, 1e11)
    four = "\n".join(x for x in text.split("\n") if not any(f"Rank  {r} " in x for r in range(4, 8)))
    message = _refusal(_write(tmp_path, "b.txt", four))
    assert "is not algbw" in message and "all_reduce's factor over 4 ranks" in message
    # a time in milliseconds under a header of microseconds
    wrong = text.replace("(us)", "(ms)")
    assert "is not size/time" in _refusal(_write(tmp_path, "c.txt", wrong))


def test_one_process_per_test_is_refused():
    """nccl-tests built without MPI=1 and started by mpirun: every process is rank 0."""
    path = DATA / "nccl-tests-v100-no-mpi.txt"
    message = _refusal(path)
    assert "line 9: '#   Rank  0 Pid   2066" in message and "rebuild with MPI=1" in message


def test_the_profile_prices_what_the_logs_measured(cluster_logs):
    """Written into the H100 preset, the simulator's network gives each measured exchange its
    fitted law: the allreduce inside a node, the one across two nodes (the ends' PCIe latency
    added back to the link's), and a transfer between nodes; their spreads replace the base's."""
    logs = [read_nccl_tests(p) for p in cluster_logs.values()]
    base = load_config(preset="h100-sxm-ndr")
    fit = fit_nccl_tests(logs)
    profile = nccl_profile(base, fit, logs)
    p = profile.platform
    assert p.nvlink is not None and p.nvlink.efficiency == 1.0
    assert p.nic.latency_s == pytest.approx(fit["nic"]["latency_s"] - 2 * p.pcie.latency_s)
    S = 2.0e8
    net = Network(p, Placement.pack(p, 16))
    law = fit["collective"]
    inside = net.allreduce_s(tuple(range(8)), S, 0.0)
    assert inside == pytest.approx(allreduce_s(8, S, law["bandwidth_bytes_per_s"], law["latency_s"]), rel=1e-9)
    law = fit["collective_between_hosts"]
    across = net.allreduce_s(tuple(range(16)), S, 1.0)
    assert across == pytest.approx(allreduce_s(16, S, law["bandwidth_bytes_per_s"], law["latency_s"]), rel=1e-9)
    _, cap, after = net.wire(0, 8, S, 2.0, both_ways=False)
    law = fit["nic"]
    assert after + S / cap == pytest.approx(transfer_s(S, law["bandwidth_bytes_per_s"], law["latency_s"]))
    u = profile.uncertainty
    assert u is not None and "platform.nic.efficiency" not in u.parameters
    assert {"platform.nic.bandwidth_bytes_per_s", "platform.collective.latency_s"} <= set(u.parameters)
    assert "platform.compute_efficiency" in u.unpinned  # the base's priors the logs say nothing of
    assert profile.provenance["platform.nic.bandwidth_bytes_per_s"].startswith("[NCCL-TESTS]")


def test_calibrate_command(tmp_path, cluster_logs, capsys):
    files = [str(p) for p in cluster_logs.values()]
    out = tmp_path / "mine.toml"
    assert main(["calibrate", "--nccl-tests", *files, "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"collective", "link", "nic", "collective_between_hosts", "allreduce_algorithm", "runs", "out"} <= set(doc)
    entries = doc["nccl_tests"]
    assert [e["file"] for e in entries] == files
    assert set(entries[0]) >= {"test", "ranks", "nodes", "sizes_bytes", "measured_s", "fitted_s"}
    assert doc["base"].endswith("h100-sxm-ndr.toml")  # the preset whose device the logs name
    # the file predict takes: the base's workload on the measured links
    assert (
        main(
            [
                "predict",
                "--platform",
                str(out),
                "--algorithm",
                "ssgd",
                "--workers",
                "1,16",
                "--steps",
                "30",
                "--jobs",
                "1",
                "--json",
                "--out",
                str(tmp_path / "p"),
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert len(rows) == 2 and rows[1]["speedup"] > 1


@pytest.mark.parametrize(
    "argv,match",
    [
        (["runs/x", "--nccl-tests", "{log}"], "give one or the other"),
        (["--preset", "h100-sxm-ndr", "runs/x"], "give the base profile of --nccl-tests"),
        (["--nccl-tests", "{other}"], "no preset names the logs' device \\('NVIDIA GB10'\\)"),
        (["--nccl-tests", "{bad}"], "line 1: 'garbage'"),
    ],
)
def test_calibrate_refusals_are_one_line_exit_2(tmp_path, cluster_logs, capsys, argv, match):
    import re

    bad = _write(tmp_path, "bad.txt", "garbage\n")
    paths = {"log": cluster_logs["ar1"], "bad": bad, "other": DATA / "nccl-tests-gb10-all_reduce.txt"}
    argv = [a.format(**paths) for a in argv]
    assert main(["calibrate", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and re.search(match, err)


def test_the_platform_written_holds_the_logs(cluster_logs):
    """--platform-hosts and --workers-per-node resize the base (a PCIe link per device stays one); a log
    with more ranks on a node than the platform's devices is refused in one line."""
    logs = [read_nccl_tests(p) for p in cluster_logs.values()]
    base = load_config(preset="h100-sxm-ndr")
    fit = fit_nccl_tests(logs)
    p = nccl_profile(base, fit, logs, hosts=32, name="mine").platform
    assert (p.name, p.hosts, p.devices_per_host, p.sockets_per_host) == ("mine", 32, 8, 8)
    with pytest.raises(ConfigError, match=r"ar1.log ran 8 ranks per node on 1 nodes.*give --workers-per-node"):
        nccl_profile(base, fit, logs, devices=4)


def test_launcher_prefixes_and_nccl_lines_are_read_through(tmp_path):
    """mpirun --tag-output's '[1,0]<stdout>:' and srun --label's '0: ' before every line, and
    NCCL's own INFO lines among the rows (a container's host name may begin with digits)."""
    text = nccl_log("all_reduce", 2, 4, 2e-6, 5e10)
    lines = text.split("\n")
    at = next(i for i, x in enumerate(lines) if x.strip().startswith("65536 "))
    lines[at:at] = ["930ae2939a89:78:78 [0] NCCL INFO Channel 00/02 : 0 1 2 3", "node-0:1:1 [0] NCCL INFO comm ready"]
    plain = read_nccl_tests(_write(tmp_path, "a.txt", "\n".join(lines)))
    for prefix in ("[1,0]<stdout>:", "0: "):
        tagged = read_nccl_tests(_write(tmp_path, "b.txt", "\n".join(prefix + x for x in lines)))
        assert (tagged.ranks, tagged.nodes, tagged.sizes_bytes, tagged.times_s) == (
            8,
            2,
            plain.sizes_bytes,
            plain.times_s,
        )


def test_rows_of_no_bytes_are_passed_over(tmp_path):
    """Sizes too small to split over the ranks print as 0 bytes, in any time (NVIDIA/nccl-tests
    issue 128 shows such rows): no point of the fit."""
    text = nccl_log("reduce_scatter", 2, 8, 5e-6, 1e11)
    zero = f"{0:12d}  {0:12d}  {'float':>8}  {'sum':>6}  {-1:6d}" + f"  {0.0:7.2f}  {0.0:6.2f}  {0.0:6.2f}  {0:5d}" * 2
    lines = text.split("\n")
    at = next(i for i, x in enumerate(lines) if x.strip().startswith("0 "))
    lines.insert(at, zero)
    log = read_nccl_tests(_write(tmp_path, "rs.txt", "\n".join(lines)))
    assert 0 not in log.sizes_bytes and log.sizes_bytes[0] == 256  # 16 ranks x 16 bytes
