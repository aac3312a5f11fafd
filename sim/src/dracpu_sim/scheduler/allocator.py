"""kube-scheduler's DRA allocation of one ResourceClaim on one node, as a pure function.

``allocate`` walks the claim's requests in order and, for each, the devices in pool order,
backtracking when a later request or a constraint cannot be met — the search the
structured allocator in kube-scheduler does — and returns the ``status.allocation``
exactly as the API stores it (protocols.md §4.2). Supported: device classes and request
selectors (CEL), ``ExactCount`` with ``count`` and ``All``, consumable capacity
(``capacity.requests`` on devices with ``allowMultipleAllocations``, rounded up per
``requestPolicy``; each result carries ``consumedCapacity`` and a ``shareID``),
``matchAttribute`` / ``distinctAttribute`` constraints across requests of any drivers (with
list-type attributes as KEP-5491 defines them: a match is a non-empty intersection of the
devices' value sets, distinct sets are pairwise disjoint, a scalar is a one-value set; a
device without the attribute never satisfies the constraint), ``firstAvailable`` sub-requests,
``adminAccess`` and class/claim opaque config. Not modelled: device taints and
tolerations, ``nodeSelector``-scoped slices, shared counters, binding conditions.

When no allocation exists, ``UnsatisfiableClaim`` says which claim, which request or
constraint, and why.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

from dracpu.allocation.quantity import QuantityError, parse_quantity
from dracpu.gofmt import go_quote
from dracpu_sim.scheduler.cel import SelectorError, compile_selector, format_quantity
from dracpu_sim.scheduler.devices import (
    AllocatedDevices,
    AttributeElement,
    DeviceKey,
    NodeDevices,
    PublishedDevice,
    attribute_key,
    gather_devices,
)

__all__ = ["DEFAULT_SEARCH_BUDGET", "UnsatisfiableClaim", "allocate", "node_selector"]

# Device placements tried before giving up on one claim (kube-scheduler bounds the same
# search with a time limit instead).
DEFAULT_SEARCH_BUDGET = 200_000


def _quote(value: object) -> str:
    return go_quote(str(value))


class UnsatisfiableClaim(Exception):
    """No allocation of ``claim`` (``namespace/name``) exists on the node; ``reason`` says why."""

    def __init__(self, claim: str, reason: str) -> None:
        super().__init__(f"claim {claim}: {reason}")
        self.claim = claim
        self.reason = reason


def node_selector(node_name: str) -> dict[str, Any]:
    return {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
        ]
    }


# -- the claim, parsed -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Alternative:
    """One way to satisfy a request: the request itself, or one of its sub-requests."""

    name: str  # the result's request name: "main" or "main/sub"
    main: str
    class_name: str
    selectors: tuple[str, ...]
    mode: Literal["ExactCount", "All"]
    count: int
    capacity: Mapping[str, Fraction]  # as written in capacity.requests
    admin_access: bool
    tolerations: tuple[Any, ...]


@dataclass(frozen=True)
class _Request:
    name: str
    alternatives: tuple[_Alternative, ...]


@dataclass
class _Constraint:
    kind: Literal["matchAttribute", "distinctAttribute"]
    attribute: str
    requests: tuple[str, ...]

    def applies(self, alt: _Alternative) -> bool:
        return not self.requests or alt.main in self.requests or alt.name in self.requests

    def describe(self) -> str:
        scope = ", ".join(self.requests) if self.requests else "all requests"
        return f"constraint {self.kind} {_quote(self.attribute)} ({scope})"


class _Bad(Exception):
    """A claim field that cannot be allocated as written; becomes UnsatisfiableClaim."""


def _alternative(raw: Mapping[str, Any], name: str, main: str, where: str) -> _Alternative:
    class_name = raw.get("deviceClassName")
    if not class_name:
        raise _Bad(f"{where}: deviceClassName is required")
    selectors = []
    for i, selector in enumerate(raw.get("selectors") or []):
        expression = (selector.get("cel") or {}).get("expression")
        if not isinstance(expression, str):
            raise _Bad(f"{where}: selector #{i}: only cel.expression selectors are supported")
        selectors.append(expression)
    mode = raw.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise _Bad(f"{where}: unknown allocationMode {_quote(mode)} (ExactCount or All)")
    count = raw.get("count", 1) if mode == "ExactCount" else 0
    if mode == "ExactCount" and (not isinstance(count, int) or count < 1):
        raise _Bad(f"{where}: count must be a positive integer, got {count}")
    capacity: dict[str, Fraction] = {}
    for key, text in ((raw.get("capacity") or {}).get("requests") or {}).items():
        try:
            capacity[key] = parse_quantity(str(text))
        except QuantityError as exc:
            raise _Bad(f"{where}: capacity.requests[{_quote(key)}]: {exc}") from None
    return _Alternative(
        name=name,
        main=main,
        class_name=str(class_name),
        selectors=tuple(selectors),
        mode="All" if mode == "All" else "ExactCount",
        count=count,
        capacity=capacity,
        admin_access=bool(raw.get("adminAccess", False)),
        tolerations=tuple(raw.get("tolerations") or ()),
    )


def _requests(claim: Mapping[str, Any]) -> list[_Request]:
    out = []
    for raw in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        name = str(raw.get("name", ""))
        where = f"request {_quote(name)}"
        exactly, first = raw.get("exactly"), raw.get("firstAvailable")
        if exactly and first:
            raise _Bad(f"{where}: exactly and firstAvailable are mutually exclusive")
        if exactly:
            out.append(_Request(name, (_alternative(exactly, name, name, where),)))
        elif first:
            subs = []
            for sub in first:
                full = f"{name}/{sub.get('name', '')}"
                subs.append(_alternative(sub, full, name, f"request {_quote(full)}"))
            out.append(_Request(name, tuple(subs)))
        else:
            raise _Bad(f"{where}: one of exactly or firstAvailable is required")
    return out


def _constraints(claim: Mapping[str, Any], names: set[str]) -> list[_Constraint]:
    out = []
    for i, raw in enumerate(
        ((claim.get("spec") or {}).get("devices") or {}).get("constraints") or []
    ):
        kinds = [k for k in ("matchAttribute", "distinctAttribute") if raw.get(k)]
        if len(kinds) != 1:
            raise _Bad(f"constraint #{i}: exactly one of matchAttribute or distinctAttribute")
        attribute = str(raw[kinds[0]])
        if "/" not in attribute:
            # The API server refuses such a claim (validateFullyQualifiedName): a constraint
            # spans drivers, so no driver's domain could be assumed for it.
            raise _Bad(
                f"spec.devices.constraints[{i}].{kinds[0]}: Invalid value: "
                f"{_quote(attribute)}: must include a domain"
            )
        requests = tuple(str(r) for r in raw.get("requests") or ())
        for r in requests:
            if r.split("/", 1)[0] not in names:
                raise _Bad(f"constraint #{i}: names unknown request {_quote(r)}")
        out.append(_Constraint(kinds[0], attribute, requests))  # type: ignore[arg-type]
    return out


# -- capacity ----------------------------------------------------------------------------------


def _round_up(wanted: Fraction, policy: Mapping[str, Any] | None) -> Fraction | None:
    """The amount a request consumes under a ``requestPolicy``; None = the policy forbids it."""
    if not policy:
        return wanted
    if policy.get("validValues"):
        for text in policy["validValues"]:
            value = parse_quantity(str(text))
            if value >= wanted:
                return value
        return None
    bounds = policy.get("validRange")
    if bounds:
        low = parse_quantity(str(bounds["min"]))
        value = max(wanted, low)
        if bounds.get("step"):
            step = parse_quantity(str(bounds["step"]))
            if step > 0:
                steps = -(-(value - low) // step)
                value = low + steps * step
        if bounds.get("max") is not None and value > parse_quantity(str(bounds["max"])):
            return None
        return value
    return wanted


@dataclass(frozen=True)
class _Shortfall:
    """Why a device cannot serve a request's capacity: (name, needed, available)."""

    capacity: str
    needed: Fraction | None  # None: the policy forbids the requested amount
    available: Fraction


def _consumption(alt: _Alternative, device: PublishedDevice) -> dict[str, Fraction] | _Shortfall:
    """Capacity this request takes from this device (``{}`` for a whole device), or the
    static reason it never fits (the device is too small or lacks the capacity)."""
    requested = {attribute_key(k, device.driver): v for k, v in alt.capacity.items()}
    for name, wanted in requested.items():
        if name not in device.capacity:
            return _Shortfall(name, wanted, Fraction(0))
    if not device.shareable:
        # On an unshared device capacity.requests is only a filter (like a selector).
        for name, wanted in requested.items():
            if wanted > device.capacity[name]:
                return _Shortfall(name, wanted, device.capacity[name])
        return {}
    out: dict[str, Fraction] = {}
    for name, total in device.capacity.items():
        policy = device.policies.get(name)
        if name in requested:
            amount = _round_up(requested[name], policy)
        elif policy and policy.get("default") is not None:
            amount = parse_quantity(str(policy["default"]))
        else:
            amount = total  # no request and no policy: the whole capacity
        if amount is None:
            return _Shortfall(name, None, total)
        if amount > total:
            return _Shortfall(name, amount, total)
        out[name] = amount
    return out


# -- the search --------------------------------------------------------------------------------


@dataclass
class _Pick:
    alt: _Alternative
    device: PublishedDevice
    consumption: dict[str, Fraction]


class _BudgetExceeded(Exception):
    pass


@dataclass
class _Candidates:
    """Devices that pass an alternative's class and request selectors, with their static
    consumption (or shortfall)."""

    in_class: list[PublishedDevice]
    matching: list[PublishedDevice]
    fitting: list[tuple[PublishedDevice, dict[str, Fraction]]]
    shortfalls: list[tuple[PublishedDevice, _Shortfall]]


@dataclass
class _Search:
    allocated: AllocatedDevices
    constraints: list[_Constraint]
    budget: int
    picks: list[_Pick] = field(default_factory=list)
    exclusive: set[DeviceKey] = field(default_factory=set)
    consumed: dict[DeviceKey, dict[str, Fraction]] = field(default_factory=dict)
    # Per constraint, with list-type attributes (KEP-5491) in mind. matchAttribute: the
    # intersection of the value sets of the devices picked so far, one entry per device, so
    # that backtracking restores the wider set (a single running intersection narrowed by
    # a device that is then taken back would wrongly keep rejecting). distinctAttribute:
    # how many picked devices hold each value (the sets must be pairwise disjoint).
    match: dict[int, list[frozenset[AttributeElement]]] = field(default_factory=dict)
    distinct: dict[int, Counter[AttributeElement]] = field(default_factory=dict)
    steps: int = 0

    def _attribute(self, c: _Constraint, device: PublishedDevice) -> frozenset[AttributeElement]:
        """The device's value set for the constraint's attribute; empty when it lacks it
        (``c.attribute`` is fully qualified; a device's unqualified names are in its
        driver's domain, as the allocator's lookupAttribute resolves them)."""
        return device.attributes.get(c.attribute, frozenset())

    def fits(self, alt: _Alternative, device: PublishedDevice, use: dict[str, Fraction]) -> bool:
        if not alt.admin_access:
            if device.key in self.exclusive or device.key in self.allocated.exclusive:
                return False
            if device.shareable:
                held = self.allocated.consumed.get(device.key, {})
                mine = self.consumed.get(device.key, {})
                for name, amount in use.items():
                    left = device.capacity[name] - held.get(name, 0) - mine.get(name, 0)
                    if amount > left:
                        return False
        for i, c in enumerate(self.constraints):
            if not c.applies(alt):
                continue
            values = self._attribute(c, device)
            if not values:
                return False  # a device without the attribute never satisfies it
            if c.kind == "matchAttribute":
                stack = self.match.get(i)
                if stack and not stack[-1] & values:
                    return False
            else:
                counts = self.distinct.get(i)
                if counts and any(counts[v] for v in values):
                    return False
        return True

    def push(self, alt: _Alternative, device: PublishedDevice, use: dict[str, Fraction]) -> None:
        self.steps += 1
        if self.steps > self.budget:
            raise _BudgetExceeded
        self.picks.append(_Pick(alt, device, use))
        if not alt.admin_access:
            if device.shareable:
                mine = self.consumed.setdefault(device.key, {})
                for name, amount in use.items():
                    mine[name] = mine.get(name, Fraction(0)) + amount
            else:
                self.exclusive.add(device.key)
        for i, c in enumerate(self.constraints):
            if not c.applies(alt):
                continue
            values = self._attribute(c, device)
            if c.kind == "matchAttribute":
                stack = self.match.setdefault(i, [])
                stack.append(stack[-1] & values if stack else values)
            else:
                self.distinct.setdefault(i, Counter()).update(values)

    def pop(self) -> None:
        pick = self.picks.pop()
        alt, device = pick.alt, pick.device
        if not alt.admin_access:
            if device.shareable:
                mine = self.consumed[device.key]
                for name, amount in pick.consumption.items():
                    mine[name] -= amount
            else:
                self.exclusive.discard(device.key)
        for i, c in enumerate(self.constraints):
            if not c.applies(alt):
                continue
            if c.kind == "matchAttribute":
                self.match[i].pop()
            else:
                self.distinct[i].subtract(self._attribute(c, device))

    def _could_fill(
        self,
        alt: _Alternative,
        fitting: list[tuple[PublishedDevice, dict[str, Fraction]]],
        start: int,
        need: int,
    ) -> bool:
        """An upper bound check: are there still ``need`` usable devices from ``start``?
        Devices under a distinctAttribute constraint count once per distinct value set."""
        if need <= 0:
            return True
        distinct = [
            i
            for i, c in enumerate(self.constraints)
            if c.applies(alt) and c.kind == "distinctAttribute"
        ]
        seen: set[tuple[frozenset[AttributeElement], ...]] = set()
        found = 0
        for device, use in fitting[start:]:
            if not self.fits(alt, device, use):
                continue
            if distinct:
                # Devices with the same value set can never be picked together.
                values = tuple(self._attribute(self.constraints[i], device) for i in distinct)
                if values in seen:
                    continue
                seen.add(values)
            found += 1
            if found >= need:
                return True
        return False

    def combinations(
        self, alt: _Alternative, fitting: list[tuple[PublishedDevice, dict[str, Fraction]]]
    ) -> Iterator[None]:
        """Yield once per placement of ``alt.count`` devices (in device order), with the
        picks pushed; the caller continues the search while suspended here."""
        n = alt.count
        chosen: list[int] = []
        pos = 0
        while True:
            if len(chosen) == n:
                yield
                last = chosen.pop()
                self.pop()
                pos = last + 1
                continue
            advanced = False
            while pos < len(fitting) and len(fitting) - pos >= n - len(chosen):
                device, use = fitting[pos]
                if self.fits(alt, device, use):
                    # Push first: a matchAttribute value fixed by this device narrows
                    # what can still follow it.
                    self.push(alt, device, use)
                    if self._could_fill(alt, fitting, pos + 1, n - len(chosen) - 1):
                        chosen.append(pos)
                        pos += 1
                        advanced = True
                        break
                    self.pop()
                pos += 1
            if advanced:
                continue
            if not chosen:
                return
            last = chosen.pop()
            self.pop()
            pos = last + 1

    def take_all(self, alt: _Alternative, candidates: _Candidates) -> bool:
        """allocationMode All: every matching device, or nothing."""
        if candidates.shortfalls or not candidates.matching:
            return False
        for pushed, (device, use) in enumerate(candidates.fitting):
            if not self.fits(alt, device, use):
                for _ in range(pushed):
                    self.pop()
                return False
            self.push(alt, device, use)
        return True

    def solve(
        self, requests: Sequence[_Request], index: int, candidates: Mapping[str, _Candidates]
    ) -> bool:
        if index == len(requests):
            return True
        for alt in requests[index].alternatives:
            found = candidates[alt.name]
            if alt.mode == "All":
                if self.take_all(alt, found):
                    if self.solve(requests, index + 1, candidates):
                        return True
                    for _ in found.fitting:
                        self.pop()
                continue
            for _ in self.combinations(alt, found.fitting):
                if self.solve(requests, index + 1, candidates):
                    return True
        return False


# -- selectors ---------------------------------------------------------------------------------


class _Selection:
    """Evaluates class and request selectors once per (selector, device) in one call."""

    def __init__(self, classes: Mapping[str, Mapping[str, Any]], node: NodeDevices) -> None:
        self.classes = classes
        self.node = node
        self._class_members: dict[str, list[PublishedDevice]] = {}

    def _filter(
        self, expressions: Sequence[str], devices: list[PublishedDevice], where: str
    ) -> list[PublishedDevice]:
        for i, expression in enumerate(expressions):
            try:
                selector = compile_selector(expression)
            except SelectorError as exc:
                raise _Bad(f"{where}: selector #{i}: {exc}") from None
            kept = []
            for device in devices:
                try:
                    if selector.matches_cached(device.fingerprint, device.cel):
                        kept.append(device)
                except SelectorError as exc:
                    raise _Bad(
                        f"{where}: selector #{i} on device {device.describe()}: {exc}"
                    ) from None
            devices = kept
        return devices

    def in_class(self, class_name: str, where: str) -> list[PublishedDevice]:
        if class_name not in self._class_members:
            device_class = self.classes.get(class_name)
            if device_class is None:
                raise _Bad(f"{where}: device class {_quote(class_name)} does not exist")
            expressions = [
                (s.get("cel") or {}).get("expression", "")
                for s in (device_class.get("spec") or {}).get("selectors") or []
            ]
            self._class_members[class_name] = self._filter(
                expressions, self.node.devices, f"{where}: device class {class_name}"
            )
        return self._class_members[class_name]

    def candidates(self, alt: _Alternative, where: str) -> _Candidates:
        members = self.in_class(alt.class_name, where)
        matching = self._filter(alt.selectors, members, where)
        fitting: list[tuple[PublishedDevice, dict[str, Fraction]]] = []
        shortfalls: list[tuple[PublishedDevice, _Shortfall]] = []
        for device in matching:
            use = _consumption(alt, device)
            if isinstance(use, _Shortfall):
                shortfalls.append((device, use))
            else:
                fitting.append((device, use))
        return _Candidates(members, matching, fitting, shortfalls)


# -- explaining a failure ----------------------------------------------------------------------


def _q(value: Fraction) -> str:
    return format_quantity(value)


def _explain_alternative(
    alt: _Alternative,
    found: _Candidates,
    allocated: AllocatedDevices,
    node_name: str,
    unusable: Sequence[str],
) -> str | None:
    """Why ``alt`` fails on its own, or None when alone it could be satisfied."""
    where = f"in class {alt.class_name} on {node_name}"
    if not found.in_class:
        suffix = f" ({'; '.join(unusable)})" if unusable else ""
        return f"no device {where}{suffix}"
    if not found.matching:
        return f"no device {where} matches the request's selectors ({len(found.in_class)} in class)"
    if alt.mode == "All" and unusable:
        return f"allocationMode All: {'; '.join(unusable)}"
    probe = _Search(allocated, [], DEFAULT_SEARCH_BUDGET)
    free = [(d, u) for d, u in found.fitting if probe.fits(alt, d, u)]
    need = len(found.matching) if alt.mode == "All" else alt.count
    if len(free) >= need and not (alt.mode == "All" and found.shortfalls):
        return None
    if alt.capacity or any(d.shareable for d in found.matching):
        return _explain_capacity(alt, found, allocated, where, len(free), need)
    if alt.mode == "All":
        return (
            f"allocationMode All needs every matching device {where}, "
            f"but {len(found.matching) - len(free)} of {len(found.matching)} are in use"
        )
    return (
        f"needs {need} device{'s' if need != 1 else ''} {where}, "
        f"{len(free)} of {len(found.matching)} matching are free"
    )


def _explain_capacity(
    alt: _Alternative,
    found: _Candidates,
    allocated: AllocatedDevices,
    where: str,
    free: int,
    need: int,
) -> str:
    # Name the first capacity that keeps devices out, with the largest amount left of it.
    wanted: dict[str, Fraction | None] = {}
    largest: dict[str, Fraction] = {}
    for device in found.matching:
        use = _consumption(alt, device)
        left = allocated.remaining(device) if device.shareable else dict(device.capacity)
        if not device.shareable and device.key in allocated.exclusive:
            left = {name: Fraction(0) for name in device.capacity}
        if isinstance(use, _Shortfall):
            wanted.setdefault(use.capacity, use.needed)
            largest[use.capacity] = max(
                largest.get(use.capacity, Fraction(0)), left.get(use.capacity, Fraction(0))
            )
            continue
        for name, taken in (use or {n: Fraction(0) for n in device.capacity}).items():
            largest[name] = max(largest.get(name, Fraction(0)), left.get(name, Fraction(0)))
            if taken > left.get(name, Fraction(0)):
                wanted.setdefault(name, taken)
    if not wanted:
        return f"needs {need} devices {where}, {free} of {len(found.matching)} matching are free"
    name, amount = next(iter(wanted.items()))
    big = largest.get(name, Fraction(0))
    if amount is None:
        return f"no device {where} accepts the requested amount of {name} under its requestPolicy"
    if need == 1:
        return f"no device {where} has {_q(amount)} {name} capacity left (largest: {_q(big)})"
    return (
        f"needs {need} devices {where} with {_q(amount)} {name} capacity left, "
        f"{free} {'has' if free == 1 else 'have'} it (largest: {_q(big)})"
    )


def _lacking_attribute(
    constraint: _Constraint, requests: Sequence[_Request], candidates: Mapping[str, _Candidates]
) -> str | None:
    """The first request under ``constraint`` none of whose candidate devices (in any of
    its alternatives) has the attribute: the constraint fails on that alone."""
    for request in requests:
        applicable = [alt for alt in request.alternatives if constraint.applies(alt)]
        if applicable and not any(
            device.attributes.get(constraint.attribute)
            for alt in applicable
            for device, _ in candidates[alt.name].fitting
        ):
            return request.name
    return None


def _explain(
    requests: Sequence[_Request],
    constraints: list[_Constraint],
    candidates: Mapping[str, _Candidates],
    allocated: AllocatedDevices,
    node_name: str,
    unusable: Sequence[str],
) -> str:
    for request in requests:
        reasons = []
        for alt in request.alternatives:
            reason = _explain_alternative(alt, candidates[alt.name], allocated, node_name, unusable)
            if reason is None:
                break
            reasons.append((alt, reason))
        else:
            if len(reasons) == 1:
                return f"request {_quote(request.name)}: {reasons[0][1]}"
            detail = "; ".join(f"{alt.name}: {reason}" for alt, reason in reasons)
            return f"request {_quote(request.name)}: no sub-request can be satisfied: {detail}"
    for constraint in constraints:
        lacking = _lacking_attribute(constraint, requests, candidates)
        if lacking is not None:
            return (
                f"{constraint.describe()}: no device for request {_quote(lacking)} "
                f"on {node_name} has this attribute"
            )
        probe = _Search(allocated, [constraint], DEFAULT_SEARCH_BUDGET)
        try:
            ok = probe.solve(requests, 0, candidates)
        except _BudgetExceeded:
            ok = True  # undecided: do not blame this constraint
        if not ok:
            if constraint.kind == "matchAttribute":
                why = "no set of free devices that share one value of it"
            else:
                why = "not enough free devices with distinct values of it"
            return f"{constraint.describe()}: {why} on {node_name}"
    if len(requests) > 1:
        names = ", ".join(_quote(r.name) for r in requests)
        return (
            f"requests {names} cannot all be satisfied together on {node_name} "
            "(they need the same free devices)"
        )
    return f"cannot be satisfied on {node_name} with the given constraints"


# -- the result --------------------------------------------------------------------------------


def _result(pick: _Pick, new_share_id: Callable[[], str]) -> dict[str, Any]:
    device = pick.device
    result: dict[str, Any] = {
        "request": pick.alt.name,
        "driver": device.key[0],
        "pool": device.key[1],
        "device": device.key[2],
    }
    if pick.alt.admin_access:
        result["adminAccess"] = True
    if pick.alt.tolerations:
        result["tolerations"] = list(pick.alt.tolerations)
    if device.shareable:
        result["shareID"] = new_share_id()
        result["consumedCapacity"] = {
            device.capacity_names[name]: _q(pick.consumption.get(name, Fraction(0)))
            for name in device.capacity
        }
    return result


def _config(
    claim: Mapping[str, Any],
    requests: Sequence[_Request],
    chosen: Mapping[str, str],
    classes: Mapping[str, Mapping[str, Any]],
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for request in requests:
        alt_name = chosen.get(request.name)
        alt = next((a for a in request.alternatives if a.name == alt_name), None)
        if alt is None:
            continue
        for entry in (classes.get(alt.class_name, {}).get("spec") or {}).get("config") or []:
            out.append(
                {
                    "source": "FromClass",
                    "requests": [alt.name],
                    **{k: v for k, v in entry.items() if k != "requests"},
                }
            )
    for entry in ((claim.get("spec") or {}).get("devices") or {}).get("config") or []:
        out.append({"source": "FromClaim", **entry})
    return out


def _claim_ref(claim: Mapping[str, Any]) -> str:
    meta = claim.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def allocate(
    claim: Mapping[str, Any],
    slices: Sequence[Mapping[str, Any]],
    classes: Mapping[str, Mapping[str, Any]],
    allocated: AllocatedDevices,
    node_name: str,
    *,
    new_share_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    search_budget: int = DEFAULT_SEARCH_BUDGET,
) -> dict[str, Any]:
    """The ``status.allocation`` for ``claim`` on ``node_name``, or UnsatisfiableClaim.

    ``classes`` maps DeviceClass names to DeviceClass objects; ``allocated`` is what other
    claims hold (see ``AllocatedDevices.from_claims``); it is not modified — add the
    result to it with ``allocated.add(...)`` before allocating the next claim.
    """
    ref = _claim_ref(claim)
    node = gather_devices(slices, node_name)
    unusable = sorted(node.unusable_pools.values())
    try:
        requests = _requests(claim)
        constraints = _constraints(claim, {r.name for r in requests})
        selection = _Selection(classes, node)
        candidates = {
            alt.name: selection.candidates(
                alt,
                f"request {_quote(alt.main)}"
                if alt.name == alt.main
                else f"request {_quote(alt.name)}",
            )
            for request in requests
            for alt in request.alternatives
        }
    except _Bad as exc:
        raise UnsatisfiableClaim(ref, str(exc)) from None
    search = _Search(allocated, constraints, search_budget)
    try:
        solved = search.solve(requests, 0, candidates)
    except _BudgetExceeded:
        raise UnsatisfiableClaim(
            ref,
            f"gave up after trying {search_budget} device placements on {node_name} "
            "(the constraints leave too many combinations to search)",
        ) from None
    if not solved:
        raise UnsatisfiableClaim(
            ref, _explain(requests, constraints, candidates, allocated, node_name, unusable)
        )
    chosen = {pick.alt.main: pick.alt.name for pick in search.picks}
    return {
        "devices": {
            "results": [_result(pick, new_share_id) for pick in search.picks],
            "config": _config(claim, requests, chosen, classes),
        },
        "nodeSelector": node_selector(node_name),
    }
