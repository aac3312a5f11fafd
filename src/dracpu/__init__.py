"""dracpu: a Kubernetes DRA driver that gives pods exclusive, topology-aligned CPUs."""

__version__ = "0.1.0"
DRIVER_NAME = "dra.cpu"
