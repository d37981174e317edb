"""The parameter server of ASGD and asynchronous EASGD, and the worker's side of its exchange.

The server is an extra process, rank ``n_workers`` (the last rank); workers are ranks
``0 .. n_workers-1``. It serves every worker's :class:`~psgdlab.core.exchange.ServerExchange`
one at a time, in arrival order, on the ``main`` channel. One exchange, both sides here so the
protocol is written once:

============  ==========================  ========================================================
direction     tag                         content
============  ==========================  ========================================================
worker ->     ``Tags.SERVER_HEADER``      int64 ``[step, rank, 0, 0]`` (received from any source)
worker ->     ``Tags.SERVER_PAYLOAD``     the algorithm's ``server_message`` (the flat model's size)
-> worker     ``Tags.SERVER_REPLY_HEADER`` int64 ``[staleness, version]``
-> worker     ``Tags.SERVER_REPLY``       the server's reply (``server_apply``), the same size
============  ==========================  ========================================================

The staleness a worker records for the step is the server's: the number of other workers'
updates it applied between this worker's last pull and this push. The payloads (the push and the
reply) go through the run's message transform (:class:`~psgdlab.runtime.loop.exchange.transform.Wire`).

The server serves the requests of every worker's steps ``[start, steps)``. When the workers agree
to stop at step ``T < steps`` (:mod:`psgdlab.runtime.loop.exchange.stopping`), worker 0 sends, after
its last step, a header ``[END_OF_REQUESTS, 0, T, 0]``: the server then serves the requests of the
steps before ``T`` -- some may still come -- checkpoints, and returns.
"""

from __future__ import annotations

import math
import signal
import time
from typing import Any

import torch

from psgdlab.core.algorithms.base import Algorithm, ServerState
from psgdlab.runtime.failures.flight import FlightRecorder
from psgdlab.runtime.loop import checkpoint as ckpt
from psgdlab.runtime.loop.exchange.transform import Wire
from psgdlab.runtime.loop.scan import count_server_requests
from psgdlab.runtime.transports.env import in_main_thread
from psgdlab.runtime.transports.transport import Tags, Transport

__all__ = ["run_server", "server_exchange", "end_requests", "END_OF_REQUESTS"]

#: the step field of a request header that says no requests of the steps from ``header[2]`` on
#: will come (a stopped run: module docstring); a responder's requests end the same way
END_OF_REQUESTS = -1


def end_requests(main: Transport, to: int, *, stop_step: int, tag: int) -> None:
    """Tell rank ``to`` that no requests of steps ``stop_step`` and later will come (``tag``: its
    requests' header tag)."""
    main.send(torch.tensor([END_OF_REQUESTS, main.rank, stop_step, 0], dtype=torch.int64), to, tag)


def server_exchange(
    main: Transport, server: int, *, step: int, rank: int, message: torch.Tensor, wire: Wire | None = None
) -> tuple[torch.Tensor, int]:
    """Send ``message`` to the parameter server (rank ``server``) and wait for its reply (both
    through ``wire``; default: as they are).

    Returns
    -------
    reply : torch.Tensor
        Shaped like ``message``.
    staleness : int
        The server's staleness of this push (module docstring).
    """
    wire = wire if wire is not None else Wire()
    header = torch.tensor([step, rank, 0, 0], dtype=torch.int64)
    main.send(header, server, Tags.SERVER_HEADER)
    wire.send(main, message, server, Tags.SERVER_PAYLOAD)
    reply_header = torch.zeros(2, dtype=torch.int64)
    main.recv(reply_header, server, Tags.SERVER_REPLY_HEADER)
    reply = wire.recv(main, message, server, Tags.SERVER_REPLY)
    return reply, int(reply_header[0])


def run_server(
    algorithm: Algorithm,
    workload: Any,
    channels: dict[str, Transport],
    *,
    options: Any,
    resume_payload: dict[str, Any] | None = None,
    flight: FlightRecorder | None = None,
) -> dict[str, Any]:
    """Serve every worker's server exchange, one at a time in arrival order (rank ``n_workers``).

    Parameters
    ----------
    algorithm : Algorithm
        Its ``server_init`` and ``server_apply`` are the server's state and update.
    workload : object
        Gives the initial parameters (``initial_params()``).
    channels : dict of str to Transport
        The process's channels; the server uses ``main``.
    options : psgdlab.runtime.loop.driver.DriverOptions
        ``start_step``, ``steps``, ``run_dir``, ``run_id``, ``checkpoint_every`` and ``transform``
        (the message transform of the push and the reply) are read.
    resume_payload : dict, optional
        A server checkpoint (:func:`psgdlab.runtime.loop.checkpoint.load_server`) to resume from.
    flight : psgdlab.runtime.failures.flight.FlightRecorder, optional
        Where each request's wait is recorded.

    Returns
    -------
    dict
        ``requests`` served, the final ``version``, and ``busy_fraction`` (time spent serving
        over the time the loop ran).
    """
    main = channels["main"]
    wire = Wire(getattr(options, "transform", None))
    x0 = workload.initial_params().to(main.device)
    if resume_payload is not None:
        server = ServerState(
            params=resume_payload["params"].to(main.device),
            version=int(resume_payload["version"]),
            last_pull=dict(resume_payload["last_pull"]),
        )
    else:
        server = algorithm.server_init(x0)
    limit = count_server_requests(algorithm, options.start_step, options.steps)
    stop = {"flag": False}

    def _on_stop(signum: int, frame: Any) -> None:
        stop["flag"] = True

    previous = (
        {sig: signal.signal(sig, _on_stop) for sig in (signal.SIGTERM, signal.SIGINT)} if in_main_thread() else {}
    )
    # with a run directory the workers agree on a stop and say when their requests end; without
    # one each worker leaves at its own step, and so does the server
    leave_at_once = options.run_dir is None
    busy, served = 0.0, 0
    t_start = time.perf_counter()
    every = max(options.checkpoint_every, 1) * algorithm.n_workers
    if flight is None:
        flight = FlightRecorder(main.rank, out=None, deadline_s=math.inf)
    elements, itemsize = wire.message_size(x0.numel(), x0.dtype)
    try:
        while served < limit and not (stop["flag"] and leave_at_once):
            header = torch.zeros(4, dtype=torch.int64)
            with flight.wait("server", what="request", step=None, nbytes=2 * elements * itemsize) as rec:
                src = main.recv(header, None, Tags.SERVER_HEADER)
                rec.update(peers=[src], step=int(header[0]))
                if int(header[0]) == END_OF_REQUESTS:
                    limit = count_server_requests(algorithm, options.start_step, int(header[2]))
                    continue
                t0 = time.perf_counter()
                message = wire.recv(main, x0, src, Tags.SERVER_PAYLOAD)
                server, reply, staleness = algorithm.server_apply(server, message, src)
                main.send(torch.tensor([staleness, server.version], dtype=torch.int64), src, Tags.SERVER_REPLY_HEADER)
                wire.send(main, reply, src, Tags.SERVER_REPLY)
            busy += time.perf_counter() - t0
            served += 1
            if options.run_dir is not None and options.checkpoint_every and served % every == 0 and served < limit:
                _save_server(options, server)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if options.run_dir is not None:
        _save_server(options, server)
    span = max(time.perf_counter() - t_start, 1e-9)
    return {"requests": served, "version": server.version, "busy_fraction": busy / span}


def _save_server(options: Any, server: ServerState) -> None:
    ckpt.save_server(
        options.run_dir,
        {"params": server.params, "version": server.version, "last_pull": dict(server.last_pull)},
        run_id=options.run_id,
    )
