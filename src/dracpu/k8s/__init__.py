"""The Kubernetes API, reached with the official ``kubernetes`` client in worker threads."""
