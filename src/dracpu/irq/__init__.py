"""Device interrupts kept off the CPUs of prepared claims that ask for it (``isolateIRQs``).

- ``masks``: the two mask formats of /proc/irq (pure);
- ``procfs``: reading and writing ``<proc root>/irq`` (blocking);
- ``plan``: one pass's writes from the originals and the banned CPUs (pure);
- ``record``: the originals kept on disk beside the checkpoint (``irq-affinity.json``);
- ``service``: ``IrqIsolation``, the Trio service;
- ``metrics``: its Prometheus collectors.
"""

from __future__ import annotations

from dracpu.irq.service import IrqIsolation, banned_cpus

__all__ = ["IrqIsolation", "banned_cpus"]
