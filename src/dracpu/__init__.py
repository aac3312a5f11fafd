"""dracpu: a Kubernetes DRA driver that gives pods exclusive, topology-aligned CPUs."""

__version__ = "0.1.0"
DRIVER_NAME = "dra.cpu"
# The API group version of the DRA objects dracpu reads and writes (ResourceSlices,
# ResourceClaims and their status): resource.k8s.io/v1, GA since Kubernetes 1.34.
RESOURCE_API_VERSION = "resource.k8s.io/v1"
