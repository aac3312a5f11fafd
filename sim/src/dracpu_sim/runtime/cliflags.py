"""The ``--cgroup-version`` and ``--cgroup-driver`` flags of every command that builds a
simulated node (``dracpu sim runtime``, ``dracpu demo``, the chaos run), defined once."""

from __future__ import annotations

import argparse
from typing import NoReturn

from dracpu_sim.runtime.layout import CGROUP_DRIVERS

__all__ = ["OneLineErrorParser", "add_cgroup_flags", "cgroup_version_arg"]


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse whose bad-flag error is one line on stderr (no usage block), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


def cgroup_version_arg(text: str) -> int:
    """``--cgroup-version``: 1 or 2 (argparse turns the error into one usage line)."""
    if text not in ("1", "2"):
        raise argparse.ArgumentTypeError(f"must be 1 or 2, got {text!r}")
    return int(text)


def add_cgroup_flags(parser: argparse.ArgumentParser, *, version: int, driver: str) -> None:
    """``--cgroup-version`` and ``--cgroup-driver``, shared by every command that builds a
    simulated node (``dracpu sim runtime``, ``dracpu demo``, the chaos run)."""
    parser.add_argument(
        "--cgroup-version",
        type=cgroup_version_arg,
        default=version,
        metavar="1|2",
        help=f"the simulated cgroup hierarchy: 1 (cpuset controller at <root>/cpuset) or 2 "
        f"(unified, <root>/cgroup.controllers) (default {version})",
    )
    parser.add_argument(
        "--cgroup-driver",
        choices=CGROUP_DRIVERS,
        default=driver,
        help="how the kubelet and containerd name pod and container cgroups: cgroupfs "
        "(/kubepods/burstable/pod<uid>/<id>) or systemd (kubepods.slice/.../"
        f"cri-containerd-<id>.scope) (default {driver})",
    )
