"""``ResourceClaim.status.devices`` as the real API server keeps it (KEP-4817). Pure.

Drivers write one ``AllocatedDeviceStatus`` per allocated device through the
``resourceclaims/status`` subresource, usually with server-side apply. What is checked
and done here follows kubernetes/kubernetes (v1.35):

- ``validate_device_statuses`` is ``validateResourceClaimStatusUpdate``'s part for
  ``status.devices`` (pkg/apis/resource/validation/validation.go, ``validateDeviceStatus``):
  driver a DNS subdomain of at most 63 characters, pool DNS subdomains joined by '/', device
  a DNS label, ``shareID`` a UUID; the entry must name a device of
  ``status.allocation.devices.results`` (driver, pool, device and shareID, printed
  ``driver/pool/device[/shareID]`` as ``structured.SharedDeviceID.String`` does, unquoted:
  Go's field errors print a Stringer bare); no two entries with the same key; at most 8
  conditions (``AllocatedDeviceStatusMaxConditions``), each valid as metav1 conditions are
  (``ValidateConditions``); ``data`` a JSON object of at most 10 KiB
  (``AllocatedDeviceStatusDataMaxLength``); ``networkData``'s interface name at most 256
  characters, hardware address at most 128, at most 16 IPs in CIDR form.
- ``drop_deallocated`` is the status strategy's ``dropDeallocatedStatusDevices``
  (pkg/registry/resource/resourceclaim/strategy.go): an update that takes devices out of
  the allocation takes their status entries with it; with the simulator's
  ``device_status=False`` (the feature gate off), ``drop_disabled_device_status`` drops the
  field from a write to a claim that had none, silently, as the strategy does.

Merging by server-side apply: the list is ``listType=map`` keyed on driver, device, pool
and shareID (k8s.io/api resource/v1 types.go), which ``apply.PATH_KEYS`` gives the merge;
each field manager's entries are its own and one that applies again without an entry
removes it. The simulator serves the feature as with ``DRAResourceClaimDeviceStatus`` on
(the default from 1.33) unless it is made with ``device_status=False``.
"""

from __future__ import annotations

import ipaddress
import json
import re
import uuid
from collections.abc import Mapping
from typing import Any

from dracpu_sim.apiserver.errors import FieldError
from dracpu_sim.apiserver.validation import (
    _dns_label,
    _dns_subdomain,
    _invalid,
    _qualified_name,
    _required,
    _too_long,
    _too_many,
)

__all__ = [
    "DATA_MAX_BYTES",
    "DEVICE_STATUS_KEYS",
    "MAX_CONDITIONS",
    "drop_deallocated",
    "drop_disabled_device_status",
    "validate_device_statuses",
]

DEVICE_STATUS_KEYS = ("driver", "device", "pool", "shareID")
MAX_CONDITIONS = 8
DATA_MAX_BYTES = 10 * 1024
MAX_INTERFACE_NAME = 256
MAX_HARDWARE_ADDRESS = 128
MAX_IPS = 16
_MAX_REASON = 1024
_MAX_MESSAGE = 32 * 1024
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
REASON_MESSAGE = (
    "a condition reason must start with alphabetic character, optionally followed by a string "
    "of alphanumeric characters or '_,:', and must end with an alphanumeric character or '_' "
    "(e.g. 'my_name',  or 'MY_NAME',  or 'MyName',  or 'ReasonA,ReasonB',  or "
    "'ReasonA:ReasonB', regex used for validation is '[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?')"
)
_STATUSES = ("False", "True", "Unknown")

Key = tuple[str, str, str, str]


def _device_id(driver: Any, pool: Any, device: Any, share: Any) -> str:
    """``structured.SharedDeviceID.String``: driver/pool/device, then /shareID if any."""
    text = f"{driver or ''}/{pool or ''}/{device or ''}"
    return f"{text}/{share}" if share else text


def _key(entry: Mapping[str, Any]) -> Key:
    return (
        str(entry.get("driver") or ""),
        str(entry.get("pool") or ""),
        str(entry.get("device") or ""),
        str(entry.get("shareID") or ""),
    )


def _allocated(claim: Mapping[str, Any]) -> set[Key]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return {_key(r) for r in results if isinstance(r, Mapping)}


def _driver(field: str, driver: Any) -> list[FieldError]:
    if not driver:
        return [_required(field)]
    text = str(driver)
    errors = [_too_long(field, 63)] if len(text) > 63 else []
    return errors + _dns_subdomain(field, text.lower())


def _pool(field: str, pool: Any) -> list[FieldError]:
    if not pool:
        return [_required(field)]
    text = str(pool)
    errors = [_too_long(field, 253)] if len(text) > 253 else []
    for part in text.split("/"):
        errors.extend(_dns_subdomain(field, part))
    return errors


def _device(field: str, device: Any) -> list[FieldError]:
    if not device:
        return [_required(field)]
    return _dns_label(field, str(device))


def _uid(field: str, value: Any) -> list[FieldError]:
    """``validateUID``: a UUID (google/uuid's parse), in its 36-character lower-case form."""
    text = str(value)
    try:
        uuid.UUID(text)
    except ValueError:
        return [_invalid(field, text, f"error validating uid: invalid UUID format: {text}")]
    if len(text) != 36 or text != text.lower():
        return [
            _invalid(
                field,
                text,
                "uid must be in RFC 4122 normalized form, "
                "`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` with lowercase hexadecimal characters",
            )
        ]
    return []


def _conditions(field: str, conditions: Any) -> list[FieldError]:
    if conditions is None:
        return []
    if not isinstance(conditions, list):
        return [_invalid(field, str(conditions), "must be a list")]
    errors: list[FieldError] = []
    if len(conditions) > MAX_CONDITIONS:
        errors.append(_too_many(field, len(conditions), MAX_CONDITIONS))
    seen: set[str] = set()
    for i, condition in enumerate(conditions):
        at = f"{field}[{i}]"
        if not isinstance(condition, Mapping):
            errors.append(_invalid(at, str(condition), "must be an object"))
            continue
        kind = str(condition.get("type") or "")
        if kind in seen:
            errors.append(
                FieldError("FieldValueDuplicate", f"{at}.type", f'Duplicate value: "{kind}"')
            )
        seen.add(kind)
        errors.extend(_qualified_name(f"{at}.type", kind))
        status = condition.get("status")
        if status not in _STATUSES:
            errors.append(
                FieldError(
                    "FieldValueNotSupported",
                    f"{at}.status",
                    f'Unsupported value: "{status or ""}": supported values: '
                    + ", ".join(f'"{s}"' for s in _STATUSES),
                )
            )
        generation = condition.get("observedGeneration", 0)
        if isinstance(generation, int) and generation < 0:
            errors.append(
                _invalid(
                    f"{at}.observedGeneration", generation, "must be greater than or equal to zero"
                )
            )
        if not condition.get("lastTransitionTime"):
            errors.append(_required(f"{at}.lastTransitionTime", "must be set"))
        reason = str(condition.get("reason") or "")
        if not reason:
            errors.append(_required(f"{at}.reason", "must be set"))
        else:
            if not _REASON.match(reason):
                errors.append(_invalid(f"{at}.reason", reason, REASON_MESSAGE))
            if len(reason) > _MAX_REASON:
                errors.append(_too_long(f"{at}.reason", _MAX_REASON))
        if len(str(condition.get("message") or "")) > _MAX_MESSAGE:
            errors.append(_too_long(f"{at}.message", _MAX_MESSAGE))
    return errors


def _data(field: str, data: Any) -> list[FieldError]:
    """``validateRawExtension`` for a new value: size first, then a JSON object."""
    if data is None:
        return []
    raw = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
    if len(raw) > DATA_MAX_BYTES:
        return [_too_long(field, DATA_MAX_BYTES)]
    if not isinstance(data, dict):
        return [
            FieldError(
                "FieldValueInvalid",
                field,
                'Invalid value: "<value omitted>": must be a valid JSON object',
            )
        ]
    return []


def _network(field: str, network: Any) -> list[FieldError]:
    if network is None:
        return []
    if not isinstance(network, Mapping):
        return [_invalid(field, str(network), "must be an object")]
    errors: list[FieldError] = []
    if len(str(network.get("interfaceName") or "")) > MAX_INTERFACE_NAME:
        errors.append(_too_long(f"{field}.interfaceName", MAX_INTERFACE_NAME))
    if len(str(network.get("hardwareAddress") or "")) > MAX_HARDWARE_ADDRESS:
        errors.append(_too_long(f"{field}.hardwareAddress", MAX_HARDWARE_ADDRESS))
    ips = network.get("ips") or []
    if len(ips) > MAX_IPS:
        return [*errors, _too_many(f"{field}.ips", len(ips), MAX_IPS)]
    seen: set[str] = set()
    for i, ip in enumerate(ips):
        at = f"{field}.ips[{i}]"
        try:
            ipaddress.ip_interface(str(ip))
            valid = "/" in str(ip)
        except ValueError:
            valid = False
        if not valid:
            errors.append(
                _invalid(
                    at,
                    ip,
                    "must be a valid address in CIDR form, (e.g. 10.9.8.7/24 or 2001:db8::1/64)",
                )
            )
        if ip in seen:
            errors.append(FieldError("FieldValueDuplicate", at, f'Duplicate value: "{ip}"'))
        seen.add(str(ip))
    return errors


def validate_device_statuses(claim: Mapping[str, Any]) -> list[FieldError]:
    """Every problem of the claim's ``status.devices`` (field paths as the real server's)."""
    entries = (claim.get("status") or {}).get("devices")
    if entries is None:
        return []
    if not isinstance(entries, list):
        return [_invalid("status.devices", str(entries), "must be a list")]
    allocated = _allocated(claim)
    errors: list[FieldError] = []
    seen: set[Key] = set()
    for i, entry in enumerate(entries):
        at = f"status.devices[{i}]"
        if not isinstance(entry, Mapping):
            errors.append(_invalid(at, str(entry), "must be an object"))
            continue
        errors += _driver(f"{at}.driver", entry.get("driver"))
        errors += _pool(f"{at}.pool", entry.get("pool"))
        errors += _device(f"{at}.device", entry.get("device"))
        share = entry.get("shareID")
        if share is not None:
            errors += _uid(f"{at}.shareID", share)
        key = _key(entry)
        shown = _device_id(*key)
        if key not in allocated:
            errors.append(
                FieldError(
                    "FieldValueInvalid",
                    at,
                    f"Invalid value: {shown}: must be an allocated device in the claim",
                )
            )
        errors += _conditions(f"{at}.conditions", entry.get("conditions"))
        errors += _data(f"{at}.data", entry.get("data"))
        errors += _network(f"{at}.networkData", entry.get("networkData"))
        if key in seen:
            errors.append(FieldError("FieldValueDuplicate", at, f"Duplicate value: {shown}"))
        seen.add(key)
    return errors


def drop_disabled_device_status(new: dict[str, Any], old: Mapping[str, Any]) -> None:
    """The ``DRAResourceClaimDeviceStatus`` gate off: ``new``'s ``status.devices`` goes,
    silently, unless ``old`` already had entries
    (``dropDisabledDRAResourceClaimDeviceStatusFields``). Changes ``new`` in place."""
    if (old.get("status") or {}).get("devices"):
        return
    status = new.get("status")
    if isinstance(status, dict):
        status.pop("devices", None)


def drop_deallocated(new: dict[str, Any], old: Mapping[str, Any]) -> None:
    """Take out of ``new``'s status the entries of devices ``old`` had allocated and ``new``
    no longer has (``dropDeallocatedStatusDevices``). Changes ``new`` in place."""
    status = new.get("status")
    if not isinstance(status, dict) or not isinstance(status.get("devices"), list):
        return
    gone = _allocated(old) - _allocated(new)
    if not gone:
        return
    kept = [e for e in status["devices"] if not (isinstance(e, Mapping) and _key(e) in gone)]
    if kept:
        status["devices"] = kept
    else:
        del status["devices"]
