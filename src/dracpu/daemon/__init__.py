"""The node daemon: state ownership, start-up recovery and the composition of services."""
