"""An embedded simulated node for ``dracpu demo`` and for tests (loopback API server and,
later, a scheduler, a kubelet, a runtime and a cgroup tree)."""
