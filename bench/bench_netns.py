"""Emulated hosts: a shaped link's achieved bandwidth against its configured rate, and a leak check
over interrupted runs (needs root; ``runtime/launcher/netns.py``).

Bandwidth (the default)::

    sudo .venv/bin/python bench/bench_netns.py [--rates 100Mbit/s,1Gbit/s,2Gbit/s] [--seconds 3]

For each rate, two emulated hosts (:class:`psgdlab.runtime.launcher.netns.EmulatedHosts`) shaped to it;
host 1 sends to host 0 for about ``--seconds``, first on a plain TCP stream, then with
torch.distributed gloo ``send``/``recv`` of 16 MiB tensors (a rank in each namespace, gloo bound
to nic0); then, on three hosts, hosts 1 and 2 send to host 0 at once, so that host 0's incoming
link is the limit (their sum against the rate: the shaping of what a host receives). Each line
prints the payload rate and its ratio to the configured rate (target: within 5 %, i.e. >= 0.95).
The ceiling of TCP payload at MTU 9000 is 0.993 of the rate (each 9014-byte frame carries 8948
bytes with TCP timestamps). The receiver's clock runs from the first byte to the last.

Concurrent exchanges (``--flows 1,2,4``)::

    sudo .venv/bin/python bench/bench_netns.py --flows 1,2,4 [--rates 500Mbit/s] [--seconds 4]

For each rate and each count ``K``, ``K`` TCP connections between host 0 and host 1, each
exchanging 2 MB both ways at once again and again (a pairwise average's traffic) for about
``--seconds``: the payload each way against the rate, and the median exchange against one
exchange's time alone at the rate (``K`` exchanges that share the link fairly take ``K`` times
it each; sent one after another they would take 1 to ``K`` times it).

A pairwise average across hosts (``--pairwise 1,3``, sizes in MB)::

    sudo .venv/bin/python bench/bench_netns.py --pairwise 1,3 [--rates 500Mbit/s] [--seconds 4]

For each rate and size, two gloo ranks on two hosts exchange as AD-PSGD's runtime does: the
active rank, after a seeded 20-60 ms of "compute", sends a header and exchanges the payload both
ways; the passive rank receives the header from any rank, copies its parameters and exchanges.
Once with the order of :func:`psgdlab.runtime.transports.torch_dist.post_exchange` (on gloo: the receive
posted before the send) and once with the send posted first (the runtime's order before
2026-11-28). Prints the exchanges' 10/50/90 % quantiles and the median against one direction's
time at the rate (1.0: both directions at once; 2.0: one after the other).

Leak check::

    sudo .venv/bin/python bench/bench_netns.py --leak 20 [--seed 0]

``--leak N`` starts ``N`` runs of ``psgdlab train --hosts 2`` and interrupts each at a random
point (seeded): SIGINT to the launcher, SIGKILL of a rank, or SIGKILL of the launcher, during
set-up or up to 3 s after the ranks started. After each it checks that nothing of the run is
left in ``ip netns list`` (for a killed launcher: after the next start, which must say what it
removed), and at the end that ``ip link``, ``tc qdisc`` and the ``psgdlab-*`` segments in
``/dev/shm`` are as before. Prints one line per run and a count. Figures only: nothing here
asserts a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from psgdlab.core.config import format_rate, parse_rate
from psgdlab.runtime.launcher import netns

MIB = 1 << 20
TCP_CEILING_MTU9000 = 8948 / 9014


def _tcp_worker(role: str, address: str, seconds: float, rate: float, port: int) -> None:
    import socket

    if role == "recv":
        srv = socket.create_server((address, port))
        srv.settimeout(30)
        conn, _ = srv.accept()
        conn.settimeout(60)
        buf = bytearray(MIB)
        got, first, last = 0, None, None
        while True:
            n = conn.recv_into(buf)
            if not n:
                break
            now = time.monotonic()  # one clock for every process of the machine
            first = first or now
            last = now
            got += n
        print(json.dumps({"bytes": got, "first": first, "last": last}))
        return
    total = int(rate * seconds)
    for _ in range(100):
        try:
            conn = socket.create_connection((address, port), timeout=30)
            break
        except OSError:
            time.sleep(0.05)
    data = b"\0" * MIB
    sent = 0
    while sent < total:
        conn.sendall(data)
        sent += len(data)
    conn.shutdown(socket.SHUT_WR)
    conn.recv(1)


EXCHANGE_BYTES = 2_000_000


def _exchange_worker(role: str, address: str, seconds: float, flows: int, port: int, idle: float = 0.0) -> None:
    """``flows`` connections (ports ``port..``), each exchanging :data:`EXCHANGE_BYTES` both ways
    at once until the client has run ``seconds``, the connection left idle ``idle`` seconds
    before each exchange; the client prints its exchanges' times."""
    import socket
    import statistics
    import threading

    def exchange(conn: socket.socket, payload: bytes, buf: bytearray) -> bool:
        sender = threading.Thread(target=conn.sendall, args=(payload,))
        sender.start()
        got = 0
        while got < len(buf):
            n = conn.recv_into(memoryview(buf)[got:])
            if not n:
                break
            got += n
        sender.join()
        return got == len(buf)

    def serve(k: int) -> None:
        srv = socket.create_server((address, port + k))
        srv.settimeout(30)
        conn, _ = srv.accept()
        conn.settimeout(60)
        payload, buf = b"\0" * EXCHANGE_BYTES, bytearray(EXCHANGE_BYTES)
        while conn.recv(1) == b"x" and exchange(conn, payload, buf):  # b"q" or a closed connection: done
            pass
        conn.close()

    times: list[float] = []
    spans: list[float] = []

    def client(k: int) -> None:
        conn = None
        for _ in range(100):
            try:
                conn = socket.create_connection((address, port + k), timeout=30)
                break
            except OSError:
                time.sleep(0.05)
        assert conn is not None
        payload, buf = b"\0" * EXCHANGE_BYTES, bytearray(EXCHANGE_BYTES)
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            if idle > 0:
                time.sleep(idle)
            start = time.monotonic()
            conn.sendall(b"x")  # the server exchanges only when asked, so both sides end cleanly
            exchange(conn, payload, buf)
            times.append(time.monotonic() - start)
        spans.append(time.monotonic() - t0)
        conn.sendall(b"q")
        conn.recv(1)  # the server's close
        conn.close()

    threads = [threading.Thread(target=serve if role == "serve" else client, args=(k,)) for k in range(flows)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if role != "serve":
        print(json.dumps({"exchanges": len(times), "span": max(spans), "median_s": statistics.median(times)}))


def _host_pair(
    kind: str, roles: tuple[str, str], args: list[str], hosts: netns.EmulatedHosts, timeout: float, **popen: Any
) -> dict[str, Any]:
    """``--worker KIND`` twice: ``roles[1]`` in host 1 (in the background), ``roles[0]`` in host 0;
    the last line host 0's worker prints, as JSON (host 1's worker killed if it outlives it)."""
    me = [sys.executable, str(Path(__file__).resolve()), "--worker", kind]
    other = subprocess.Popen([*hosts.exec_prefix(1), *me, roles[1], *args], stdout=subprocess.DEVNULL, **popen)
    try:
        out = subprocess.run(
            [*hosts.exec_prefix(0), *me, roles[0], *args], capture_output=True, text=True, timeout=timeout, **popen
        )
        other.wait(timeout=60)
    finally:
        if other.poll() is None:
            other.kill()
            other.wait(timeout=10)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _exchanges(hosts: netns.EmulatedHosts, seconds: float, flows: int, idle: float = 0.0) -> dict[str, float]:
    """:func:`_exchange_worker` with its server in host 1 and its client in host 0."""
    args = ["--address", hosts.address(1), "--seconds", str(seconds), "--flows", str(flows), "--idle", str(idle)]
    return _host_pair("exchange", ("client", "serve"), args, hosts, seconds * 4 + 60)


def flows(rates: list[str], seconds: float, counts: list[int]) -> None:
    print(f"{EXCHANGE_BYTES / 1e6:g} MB exchanged both ways on K connections at once, {seconds:g} s per case")
    print(f"{'rate':>10s} {'K':>3s} {'each way':>12s} {'ratio':>7s} {'median exchange':>16s} {'/ alone':>8s}")
    for rate, hosts in _two_hosts(rates):
        for k in counts:
            r = _exchanges(hosts, seconds, k)
            each_way = r["exchanges"] * EXCHANGE_BYTES / r["span"]
            alone = EXCHANGE_BYTES / rate
            print(
                f"{format_rate(rate):>10s} {k:>3d} {format_rate(each_way):>12s} {each_way / rate:7.3f} "
                f"{r['median_s'] * 1e3:13.1f} ms {r['median_s'] / alone:8.2f}"
            )


def idle_connections(rates: list[str], seconds: float, idles: list[float]) -> None:
    """One connection exchanging after ``idles`` seconds of idleness: whether a connection that
    sat idle (a random ring's pair, met again after several steps) is slower to start than one
    in steady use (TCP restarts its congestion window after an idle period of a retransmission
    timeout, ``net.ipv4.tcp_slow_start_after_idle``)."""
    print(f"{EXCHANGE_BYTES / 1e6:g} MB exchanged both ways on one connection idle before each, {seconds:g} s a case")
    print(f"{'rate':>10s} {'idle':>8s} {'median exchange':>16s} {'/ alone':>8s} {'/ back to back':>15s}")
    for rate, hosts in _two_hosts(rates):
        alone = EXCHANGE_BYTES / rate
        first = None
        for idle in idles:
            r = _exchanges(hosts, seconds, 1, idle)
            first = first or r["median_s"]
            print(
                f"{format_rate(rate):>10s} {idle * 1e3:5.0f} ms {r['median_s'] * 1e3:13.1f} ms "
                f"{r['median_s'] / alone:8.2f} {r['median_s'] / first:15.2f}"
            )


PAIRWISE_ORDERS = ("psgdlab", "sends first")
PAIRWISE_LEAST = 20  # exchanges a case makes at least, past the first 3


def _pairwise_worker(rank: int, address: str, seconds: float, nbytes: int, order: str) -> None:
    """One rank of ``--pairwise`` (rank 0 active, rank 1 passive); rank 0 prints its exchanges' times."""
    import datetime

    import numpy as np
    import torch
    import torch.distributed as dist

    from psgdlab.runtime.transports.torch_dist import post_exchange, wait_all

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR=address, MASTER_PORT="29512", GLOO_SOCKET_IFNAME=netns.IFACE)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    params = torch.ones(nbytes // 4)
    recv = torch.empty_like(params)
    header = torch.zeros(4, dtype=torch.int64)
    peer = 1 - rank

    def exchange(send: torch.Tensor) -> None:
        if order == "psgdlab":
            wait_all(post_exchange(send, [recv], [peer], None, tag=2))
        else:
            wait_all([dist.isend(send, dst=peer, tag=2), dist.irecv(recv, src=peer, tag=2)])

    rng = np.random.default_rng(0)
    times: list[float] = []
    t0 = time.monotonic()
    while True:
        if rank == 0:  # the active side decides when to stop, and says so in the header
            time.sleep(float(rng.uniform(0.02, 0.06)))
            header[0] = int(time.monotonic() - t0 < seconds or len(times) < PAIRWISE_LEAST + 3)
            start = time.monotonic()
            dist.send(header, 1, tag=1)
            if not header[0]:
                break
            exchange(params)
            times.append(time.monotonic() - start)
        else:
            dist.recv(header, None, tag=1)
            if not header[0]:
                break
            exchange(params.clone())
    if rank == 0:
        print(json.dumps({"times": times[3:]}))  # the first exchanges open the connection and its window
    dist.barrier()
    dist.destroy_process_group()


def pairwise(rates: list[str], seconds: float, sizes_mb: list[float]) -> None:
    import numpy as np

    print(f"a pairwise average between 2 hosts over gloo, about {seconds:g} s per case")
    print(f"{'rate':>10s} {'size':>7s} {'order':>12s} {'10 %':>8s} {'50 %':>8s} {'90 %':>8s} {'50 % / one way':>15s}")
    env = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR")  # no reverse DNS in the namespaces: c10d warns
    for rate, hosts in _two_hosts(rates):
        for mb in sizes_mb:
            nbytes = int(mb * 1e6) // 4 * 4
            for order in PAIRWISE_ORDERS:
                args = ["--address", hosts.address(0), "--seconds", str(seconds), "--nbytes", str(nbytes)]
                args += ["--order", order]
                times = _host_pair("pairwise", ("0", "1"), args, hosts, seconds * 4 + 120, env=env)["times"]
                ms = np.array(times) * 1e3
                q10, q50, q90 = np.percentile(ms, [10, 50, 90])
                one_way = nbytes / rate * 1e3
                print(
                    f"{format_rate(rate):>10s} {mb:4g} MB {order:>12s} {q10:5.1f} ms {q50:5.1f} ms {q90:5.1f} ms "
                    f"{q50 / one_way:15.2f}"
                )


def _two_hosts(rates: list[str]) -> Iterator[tuple[float, netns.EmulatedHosts]]:
    """Two emulated hosts shaped to each of ``rates`` in turn, reachable: (bytes/s, the hosts),
    removed when the caller moves on (or stops)."""
    for text in rates:
        rate = parse_rate(text)
        with netns.EmulatedHosts(2, rate) as hosts:
            hosts.wait_until_reachable()
            yield rate, hosts


def _gloo_worker(rank: int, address: str, seconds: float, rate: float) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR=address, MASTER_PORT="29511", GLOO_SOCKET_IFNAME=netns.IFACE)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    size = 16 * MIB
    reps = max(3, int(rate * seconds / size))
    buf = torch.zeros(size // 4, dtype=torch.float32)
    if rank == 1:
        dist.send(buf, 0)  # warm-up: connections made, windows open
        for _ in range(reps):
            dist.send(buf, 0)
    else:
        dist.recv(buf, 1)
        t0 = time.monotonic()
        for _ in range(reps):
            dist.recv(buf, 1)
        print(json.dumps({"bytes": reps * size, "first": t0, "last": time.monotonic()}))
    dist.barrier()
    dist.destroy_process_group()


def _pair(hosts: netns.EmulatedHosts, kind: str, seconds: float, rate: float, senders: int = 1) -> float:
    """Receivers in host 0, one sender in each of hosts 1..senders (at once); the payload rate
    into host 0 in bytes/s (all bytes over the span from the first to the last)."""
    me = [sys.executable, str(Path(__file__).resolve()), "--worker", kind]
    args = ["--address", hosts.address(0), "--seconds", str(seconds), "--rate-bytes", str(rate)]
    roles = ("recv", "send") if kind == "tcp" else ("0", "1")
    env = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR")  # no reverse DNS in the namespaces: c10d warns
    procs, recvs = [], []
    try:
        for s in range(1, senders + 1):
            port = ["--port", str(5200 + s)]
            recvs.append(
                subprocess.Popen(
                    [*hosts.exec_prefix(0), *me, roles[0], *args, *port], stdout=subprocess.PIPE, text=True, env=env
                )
            )
            procs.append(
                subprocess.Popen(
                    [*hosts.exec_prefix(s), *me, roles[1], *args, *port], stdout=subprocess.DEVNULL, env=env
                )
            )
        results = [json.loads(r.communicate(timeout=seconds * 4 + 120)[0].strip().splitlines()[-1]) for r in recvs]
        for p in procs:
            p.wait(timeout=60)
    finally:
        for p in procs + recvs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    span = max(r["last"] for r in results) - min(r["first"] for r in results)
    return sum(r["bytes"] for r in results) / span


def bandwidth(rates: list[str], seconds: float) -> None:
    print(f"shaped link, host 1 -> host 0, {seconds:g} s per case (ceiling of TCP payload at MTU 9000: 0.993)")
    print(f"{'rate':>10s} {'transport':>16s} {'achieved':>12s} {'ratio':>7s}")
    for rate, two in _two_hosts(rates):
        for kind, label in (("tcp", "tcp stream"), ("gloo", "gloo send/recv")):
            achieved = _pair(two, kind, seconds, rate)
            print(f"{format_rate(rate):>10s} {label:>16s} {format_rate(achieved):>12s} {achieved / rate:7.3f}")
        with netns.EmulatedHosts(3, rate) as hosts:  # host 0's incoming link shared by two senders
            hosts.wait_until_reachable()
            achieved = _pair(hosts, "tcp", seconds, rate, senders=2)
            print(
                f"{format_rate(rate):>10s} {'2 tcp into one':>16s} {format_rate(achieved):>12s} {achieved / rate:7.3f}"
            )


def _names(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]


def _state() -> tuple[str, str, list[str]]:
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=20).stdout
    qdiscs = subprocess.run(["tc", "qdisc"], capture_output=True, text=True, timeout=20).stdout
    return links, qdiscs, sorted(p.name for p in Path("/dev/shm").glob("psgdlab-*"))


def leak(runs: int, seed: int) -> int:
    rng = random.Random(seed)
    before = _state()
    work = Path(tempfile.mkdtemp(prefix="bench-netns-"))
    argv = ["--algorithm", "ssgd", "--workers", "2", "--hosts", "2", "--nic-bandwidth", "100Mbit/s"]
    argv += ["--model", "least-squares", "--steps", "5000", "--compute-time", "0.02", "--timeout", "30"]
    left_total, pending, removed_by_starts = 0, [], 0
    proc: subprocess.Popen | None = None
    try:
        for i in range(runs):
            kind = rng.choice(["sigint", "rank", "launcher"])
            when = rng.choice(["set-up", "running"])
            delay = rng.uniform(0.0, 3.0)
            out = work / f"run{i}"
            proc = subprocess.Popen(
                [sys.executable, "-m", "psgdlab", "train", *argv, "--out", str(out)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            prefix = f"psgd-{proc.pid}-"
            deadline = time.monotonic() + 120
            if when == "set-up":
                while not _names(prefix) and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.01)
            else:
                pid_files = [out / ".ranks" / f"rank{r}.pid" for r in range(2)]
                while not all(f.is_file() for f in pid_files) and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                time.sleep(delay)
            if kind == "sigint":
                proc.send_signal(signal.SIGINT)
            elif kind == "launcher":
                proc.kill()
            else:
                pid_file = out / ".ranks" / "rank1.pid"
                text = pid_file.read_text().strip() if pid_file.is_file() else ""
                if text.isdigit():
                    try:
                        os.kill(int(text), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                else:
                    proc.send_signal(signal.SIGINT)  # no rank yet to kill: stop the launcher instead
                    kind = "sigint (no rank yet)"
            try:
                _, err = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate(timeout=30)
                err += " [launcher did not stop within 120 s]"
            lines = (err or "").strip().splitlines()
            last = lines[-1:] or [""]
            for line in lines:  # the clean-up of earlier killed launchers, said by this start
                if line.startswith("psgdlab: removed "):
                    removed_by_starts += int(line.split()[2])
            if kind == "launcher":
                pending.append(prefix)
                left = _names(prefix)
                print(f"run {i:2d}: {kind:8s} at {when:8s}: {len(left)} namespaces wait for the next start")
                continue
            left = _names(prefix)
            left_total += len(left)
            said = f"exit {proc.returncode}, left {left or 'nothing'}: {last[0][:100]}"
            print(f"run {i:2d}: {kind:8s} at {when:8s}: {said}")
    finally:
        if proc is not None and proc.poll() is None:  # the bench was stopped: its run stops and cleans up
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    removed, _ = netns.remove_stale()  # the next start's clean-up
    print(
        f"{len(pending)} launchers killed: the next starts removed {removed_by_starts} of their namespaces, "
        f"a last clean-up {len(removed)}"
    )
    after_all = [n for prefix in pending for n in _names(prefix)]
    left_total += len(after_all)
    same = _state() == before
    print(
        f"{runs} interrupted runs: {left_total} namespaces left, ip link, tc qdisc and the data plane's "
        f"/dev/shm segments {'as before' if same else 'CHANGED'}"
    )
    shutil.rmtree(work, ignore_errors=True)
    return 0 if left_total == 0 and same else 1


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(f"bench_netns: stopped by {signal.Signals(signum).name}; its namespaces were removed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="100Mbit/s,1Gbit/s,2Gbit/s")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--leak", type=int, default=0, metavar="N", help="N interrupted runs instead")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker", nargs=2, metavar=("KIND", "ROLE"), help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--rate-bytes", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=5201, help=argparse.SUPPRESS)
    parser.add_argument(
        "--flows", default="", metavar="K[,...]", help="concurrent exchanges on K connections instead (e.g. 1,2,4)"
    )
    parser.add_argument(
        "--pairwise",
        default="",
        metavar="MB[,...]",
        help="a pairwise average's payload of MB both ways between two gloo ranks instead (e.g. 1,3)",
    )
    parser.add_argument("--nbytes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--order", choices=PAIRWISE_ORDERS, help=argparse.SUPPRESS)
    parser.add_argument(
        "--idle",
        default="",
        metavar="S[,...]",
        help="one connection's exchanges after S seconds idle instead (e.g. 0,0.05,0.5; the first: the baseline)",
    )
    args = parser.parse_args()
    if args.worker:
        kind, role = args.worker
        if kind == "exchange":
            _exchange_worker(role, args.address, args.seconds, int(args.flows), args.port, float(args.idle or 0))
        elif kind == "pairwise":
            _pairwise_worker(int(role), args.address, args.seconds, args.nbytes, args.order)
        elif kind == "tcp":
            _tcp_worker(role, args.address, args.seconds, args.rate_bytes, args.port)
        else:
            _gloo_worker(int(role), args.address, args.seconds, args.rate_bytes)
        return 0
    # SIGTERM unwinds like Ctrl-C: the hosts' ``with`` blocks and the leak runs' ``finally`` clean up
    signal.signal(signal.SIGTERM, _terminate)
    reason = netns.unavailable_reason()
    if reason is not None:
        print(f"bench_netns: {reason}", file=sys.stderr)
        return 2
    if args.leak:
        return leak(args.leak, args.seed)
    rates = [r for r in args.rates.split(",") if r]
    modes = (  # a list-valued flag that picks a mode of its own: (value, flag, kind, least, rule, mode)
        (args.idle, "--idle", float, 0.0, "seconds >= 0, like 0,0.05,0.5", idle_connections),
        (args.flows, "--flows", int, 1, "counts >= 1, like 1,2,4", flows),
        (args.pairwise, "--pairwise", float, 0.001, "sizes in MB >= 0.001, like 1,3", pairwise),
    )
    for text, flag, kind, least, rule, mode in modes:
        if text:
            values = _numbers(text, flag, kind, least, rule)
            if values is None:
                return 2
            mode(rates, args.seconds, values)
            return 0
    bandwidth(rates, args.seconds)
    return 0


def _numbers(text: str, flag: str, kind: type, least: float, rule: str) -> list[Any] | None:
    """The comma-separated numbers of ``flag``; ``None``, after a one-line error naming the
    value and ``rule``, when they are not numbers of ``kind`` of at least ``least``."""
    try:
        values = [kind(x) for x in text.split(",") if x]
    except ValueError:
        values = []
    if not values or min(values) < least:
        print(f"bench_netns: {flag} ({text!r}) must be {rule}", file=sys.stderr)
        return None
    return values


if __name__ == "__main__":
    sys.exit(main())
