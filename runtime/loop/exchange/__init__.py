"""How a rank exchanges with its peers: one interface, two protocols, one message transform.

The step loop (:mod:`psgdlab.runtime.loop.driver`) decides *when* each exchange of a step runs
(its phase); an :class:`~psgdlab.runtime.loop.exchange.protocol.ExchangeProtocol` decides *how*
(PyTorch's DDP comm hooks and model averagers keep the two apart the same way):

- :mod:`~psgdlab.runtime.loop.exchange.protocol`: the interface, the model the threads share
  (:class:`~psgdlab.runtime.loop.exchange.protocol.Replica`) and the record one step hands its
  phases;
- :mod:`~psgdlab.runtime.loop.exchange.normal`: every rank to the end (a failure stops the run);
- :mod:`~psgdlab.runtime.loop.exchange.surviving`: ``--on-failure continue``, the survivors of a
  gossip run go on without the dead (it owns what
  :class:`~psgdlab.runtime.failures.survive.survivors.Survivors` and its mailbox give it);
- :mod:`~psgdlab.runtime.loop.exchange.transform`: what every payload goes through on its way to
  the wire (the identity by default; a cast to float16);
- :mod:`~psgdlab.runtime.loop.exchange.stopping`: a stop the ranks agree on without a collective
  (SIGINT, SIGTERM of an asynchronous or surviving run).

Part of the loop: it uses the transport interface and the survivors' protocol, never a launcher.
"""
