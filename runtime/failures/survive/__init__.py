"""``--on-failure continue``: the survivors of a gossip run go on without the dead.

- :mod:`~psgdlab.runtime.failures.survive.survivors`: what a rank needs to go on (the driver's
  side);
- :mod:`~psgdlab.runtime.failures.survive.agreement`: one membership every survivor agrees on;
- :mod:`~psgdlab.runtime.failures.survive.mailbox`: the control messages and the detection;
- :mod:`~psgdlab.runtime.failures.survive.regroup`: collectives over a group the survivors form.
"""
