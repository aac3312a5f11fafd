"""Where the DRA service gets the ResourceClaims the kubelet names (behavior.md §7 step 1).

The kubelet sends only namespace, name and UID; the service asks a ``ClaimSource`` for the
allocated claim. ``ApiClaimSource`` GETs it from the API server; ``MemoryClaimSource``
answers from a dict, for tests, the benchmark and the simulated node. Both raise the
``ClaimReadError`` subclasses of ``dracpu.k8s.claims`` with the §7 texts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import msgspec

from dracpu import DRIVER_NAME
from dracpu.allocation.prepare import ClaimAllocation
from dracpu.k8s.claims import ClaimNotAllocated, ClaimNotFound, ClaimReplaced, read_claim
from dracpu.k8s.client import KubeClient

__all__ = ["ApiClaimSource", "ClaimSource", "MemoryClaimSource"]


class ClaimSource(Protocol):
    async def get(self, namespace: str, name: str, uid: str) -> ClaimAllocation:
        """The allocated claim; raises a ``dracpu.k8s.claims.ClaimReadError`` subclass."""
        ...


class ApiClaimSource:
    """Claims read from the API server, keeping only this node's pool of our driver."""

    def __init__(self, api: KubeClient, pool: str, *, driver: str = DRIVER_NAME) -> None:
        self._api = api
        self._pool = pool
        self._driver = driver

    async def get(self, namespace: str, name: str, uid: str) -> ClaimAllocation:
        return await read_claim(
            api=self._api,
            namespace=namespace,
            name=name,
            uid=uid,
            driver=self._driver,
            pool=self._pool,
        )


class MemoryClaimSource:
    """Claims held in memory, keyed by (namespace, name) like the API server keys them.

    With ``pool`` set, ``get`` keeps only that pool's results of our driver, as
    ``ApiClaimSource`` does; without it claims come back as stored.
    """

    def __init__(
        self,
        claims: Iterable[ClaimAllocation] = (),
        *,
        pool: str | None = None,
        driver: str = DRIVER_NAME,
    ) -> None:
        self._claims: dict[tuple[str, str], ClaimAllocation] = {}
        self._pool = pool
        self._driver = driver
        for claim in claims:
            self.put(claim)

    def put(self, claim: ClaimAllocation) -> None:
        """Add or replace the claim stored under its namespace and name."""
        self._claims[(claim.namespace, claim.name)] = claim

    def delete(self, namespace: str, name: str) -> None:
        self._claims.pop((namespace, name), None)

    def __len__(self) -> int:
        return len(self._claims)

    async def get(self, namespace: str, name: str, uid: str) -> ClaimAllocation:
        where = f"{namespace}/{name}"
        claim = self._claims.get((namespace, name))
        if claim is None:
            raise ClaimNotFound(
                namespace,
                name,
                f'retrieve claim {where}: resourceclaims.resource.k8s.io "{name}" not found',
            )
        if claim.uid != uid:
            raise ClaimReplaced(namespace, name, f"claim {where} got replaced")
        if not claim.allocated:
            raise ClaimNotAllocated(namespace, name, f"claim {where} not allocated")
        if self._pool is None:
            return claim
        results = tuple(
            r for r in claim.results if r.driver == self._driver and r.pool == self._pool
        )
        return msgspec.structs.replace(claim, results=results)
