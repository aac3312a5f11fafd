"""The support bundle's objects from the API server: other drivers' ResourceSlices of this
node and the DeviceClasses, reached with the driver's kubeconfig (its files resolved
through its root) or the one given, in a child process bounded in time
(``dracpu.gatherinfo`` says why)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from dracpu import RESOURCE_API_VERSION
from dracpu.gatherinfo.report import REPORT_CLASSES, REPORT_SLICES, ApiObjects, GatherinfoError


def read_bundle_objects(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A report's other drivers' ResourceSlices and the cluster's DeviceClasses, as
    gathered (``resourceSlices``, ``deviceClasses``); empty lists when the report has none
    (gathered without an API server, or by an older dracpu). ``path`` is read as
    ``sysfs_root`` reads a report; a section that is not a list of mappings is an error."""
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as err:
        raise GatherinfoError(f"read gatherinfo report {path}: {err}") from err
    report = docs[0] if len(docs) == 1 and isinstance(docs[0], dict) else {}
    out: list[list[dict[str, Any]]] = []
    for key in (REPORT_SLICES, REPORT_CLASSES):
        section = report.get(key) or []
        if not isinstance(section, list) or not all(isinstance(o, dict) for o in section):
            raise GatherinfoError(f"{path}: {key} must be a list of objects")
        out.append(section)
    return out[0], out[1]


def _as_gathered(obj: Mapping[str, Any]) -> dict[str, Any]:
    """An object without the metadata its API server set (uid, resourceVersion, owner
    references to a Node of that cluster, managed fields, ...): what another API server
    accepts as a new object."""
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": obj.get("apiVersion", RESOURCE_API_VERSION),
        "kind": obj.get("kind"),
        "metadata": {k: meta[k] for k in ("name", "labels", "annotations") if meta.get(k)},
        "spec": obj.get("spec") or {},
    }


def other_drivers_slices(
    slices: Sequence[Mapping[str, Any]], node_name: str, driver: str
) -> list[dict[str, Any]]:
    """The slices of this node (``spec.nodeName``) that another driver than ``driver``
    published, by name, as gathered (``_as_gathered``). Slices for all nodes or chosen by
    a node selector are the cluster's, not this node's, and are left out."""
    out = [
        _as_gathered({"kind": "ResourceSlice", **s})
        for s in slices
        if (s.get("spec") or {}).get("nodeName") == node_name
        and (s.get("spec") or {}).get("driver") != driver
    ]
    return sorted(out, key=lambda s: str(s["metadata"].get("name", "")))


def gather_api_objects(
    api_client: Any, node_name: str, driver: str, *, timeout: float = 10.0
) -> ApiObjects:
    """Other drivers' ResourceSlices on ``node_name`` and every DeviceClass, read through
    ``api_client`` (a ``kubernetes`` ``ApiClient``). The slices are listed with the
    ``spec.nodeName`` field selector the API server offers for ResourceSlices. Raises
    GatherinfoError when listing the slices fails (unreachable, forbidden, ...); when only
    the DeviceClasses cannot be listed, the source says so."""
    from kubernetes import client as k8s_client

    from dracpu.k8s.client import translate_error

    api = k8s_client.ResourceV1Api(api_client)

    def listed(what: str, fn: Any, **kwargs: Any) -> list[dict[str, Any]]:
        try:
            response = fn(_preload_content=False, _request_timeout=timeout, **kwargs)
            body = json.loads(response.data)
        except Exception as exc:  # the client's errors vary by transport: translate them
            raise GatherinfoError(f"list {what}: {translate_error(exc)}") from None
        items = body.get("items") if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise GatherinfoError(f"list {what}: the API server's answer has no items list")
        return [i for i in items if isinstance(i, dict)]

    raw_slices = listed(
        "ResourceSlices", api.list_resource_slice, field_selector=f"spec.nodeName={node_name}"
    )
    slices = other_drivers_slices(raw_slices, node_name, driver)
    # The driver's own ServiceAccount may list ResourceSlices but not DeviceClasses
    # (deploy/base/rbac.yaml grants what the daemon needs): the slices still count.
    try:
        listed_classes = listed("DeviceClasses", api.list_device_class)
        classes_text = f", {len(listed_classes)} DeviceClass(es)"
    except GatherinfoError as err:
        listed_classes = []
        classes_text = f"; no DeviceClasses: {err}"
    classes = sorted(
        (_as_gathered({"kind": "DeviceClass", **c}) for c in listed_classes),
        key=lambda c: str(c["metadata"].get("name", "")),
    )
    drivers = sorted({str(s["spec"].get("driver")) for s in slices})
    source = (
        f"API server {api_client.configuration.host}: {len(slices)} ResourceSlice(s) of "
        f"other drivers on node {node_name}"
        + (f" ({', '.join(drivers)})" if drivers else "")
        + classes_text
    )
    return ApiObjects(slices=slices, classes=classes, source=source)


# Per kubeconfig section: the entry's body and the keys naming files (client-go's
# ResolvePaths list for clusters and users; the kubernetes Python client reads these).
_KUBECONFIG_FILES = (
    ("clusters", "cluster", ("certificate-authority",)),
    ("users", "user", ("client-certificate", "client-key", "tokenFile")),
)
# Ways a kubeconfig user gets credentials by running something.
_CREDENTIAL_PLUGINS = ("exec", "auth-provider")


def driver_kubeconfig(path: str, resolve: Callable[[str], str]) -> dict[str, Any]:
    """The running driver's kubeconfig, ``path`` as the driver names it, with every file
    it names resolved as the driver sees it (``resolve``, ``path_in_process``). A relative
    file is relative to the kubeconfig's own directory, as client-go and the Python client
    read it. Raises GatherinfoError when it cannot be read, is no kubeconfig, or a user gets
    credentials from a plugin (it would run here, on gatherinfo's filesystem)."""
    seen = resolve(path)
    try:
        config = yaml.safe_load(Path(seen).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        why = err.strerror if isinstance(err, OSError) else str(err)
        raise GatherinfoError(f"read the running driver's kubeconfig {path}: {why}") from None
    if not isinstance(config, dict):
        raise GatherinfoError(f"the running driver's kubeconfig {path} is not a kubeconfig")
    base = os.path.dirname(path)
    for section, body_key, file_keys in _KUBECONFIG_FILES:
        entries = config.get(section) or []
        for entry in entries if isinstance(entries, list) else ():
            body = entry.get(body_key) if isinstance(entry, dict) else None
            if not isinstance(body, dict):
                continue
            plugin = next((p for p in _CREDENTIAL_PLUGINS if p in body), None)
            if plugin is not None:
                raise GatherinfoError(
                    f"the running driver's kubeconfig {path} gets user "
                    f"{entry.get('name', '')!r}'s credentials from a plugin ({plugin}), "
                    "which would run here rather than in the driver's filesystem; pass "
                    "--kubeconfig"
                )
            for key in file_keys:
                value = body.get(key)
                if isinstance(value, str) and value:
                    body[key] = resolve(os.path.join(base, value))
    return config


def write_private_kubeconfig(config: Mapping[str, Any]) -> Path:
    """``config`` in a new temporary file only this user can read (it may hold keys or
    tokens inline); the caller removes it."""
    fd, name = tempfile.mkstemp(prefix="dracpu-gatherinfo-kubeconfig-", suffix=".yaml")
    try:
        with os.fdopen(fd, "w") as out:
            yaml.safe_dump(dict(config), out)
    except OSError as err:
        os.unlink(name)
        raise GatherinfoError(f"write a temporary kubeconfig: {err}") from err
    return Path(name)


def _api_step_main() -> None:
    """The child process of ``gather_api_objects_within``: its request as JSON on stdin,
    its outcome as JSON on stdout (``{"ok": {...}}`` or ``{"error": "..."}``)."""
    from dracpu.k8s.client import K8sError, load_api_client

    request = json.load(sys.stdin)
    outcome: dict[str, Any]
    try:
        # No retries: a node without a reachable API server should not hold the report up.
        api_client = load_api_client(request["kubeconfig"], retries=0)
        try:
            found = gather_api_objects(
                api_client, request["node"], request["driver"], timeout=request["timeout"]
            )
        finally:
            api_client.close()  # type: ignore[no-untyped-call]
        outcome = {"ok": {"slices": found.slices, "classes": found.classes, "source": found.source}}
    except (GatherinfoError, K8sError) as err:
        outcome = {"error": str(err)}
    json.dump(outcome, sys.stdout)


def gather_api_objects_within(
    kubeconfig: str | None,
    node_name: str,
    driver: str,
    *,
    deadline: float,
    request_timeout: float = 10.0,
) -> ApiObjects:
    """``gather_api_objects`` through a client loaded from ``kubeconfig`` (None: in-cluster
    config), all of it, credential plugins included, in a child process of its own session
    (so of its own process group) given ``deadline`` seconds: past it the group is killed,
    plugins with it, and GatherinfoError says so, as it does for every failure of the step.
    A new interpreter rather than a fork: the caller may hold threads, and nothing of the
    caller's ``__main__`` is run again."""
    if not deadline > 0:
        raise GatherinfoError(f"the API step's time limit must be > 0 seconds, got {deadline}")
    request = {
        "kubeconfig": kubeconfig,
        "node": node_name,
        "driver": driver,
        "timeout": min(request_timeout, deadline),
    }
    argv = [
        sys.executable,
        "-c",
        "from dracpu.gatherinfo.api import _api_step_main; _api_step_main()",
    ]
    try:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as err:
        raise GatherinfoError(f"start the API step: {err}") from err
    try:
        out, err_text = child.communicate(json.dumps(request).encode(), timeout=deadline)
    except subprocess.TimeoutExpired:
        raise GatherinfoError(
            f"the API step did not finish within {deadline:g} s (API server or credential "
            "plugin not answering); stopped it"
        ) from None
    finally:
        _stop(child)
    try:
        outcome = json.loads(out)
        if "ok" in outcome:
            found = outcome["ok"]
            return ApiObjects(
                slices=found["slices"], classes=found["classes"], source=found["source"]
            )
        message = str(outcome["error"])
    except (ValueError, KeyError, TypeError):
        last = err_text.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        message = f"the API step failed (exit code {child.returncode}): {last[0]}"
    raise GatherinfoError(message)


def _stop(child: subprocess.Popen[bytes]) -> None:
    """A child not reaped yet (the step ran out of time): kill its process group (the
    child, and what it started: a credential plugin) and reap it. The group's ID is the
    child's PID, which stays ours until the child is reaped, so no stranger is signalled.
    A plugin that left the group and keeps the pipes open is not waited for long."""
    if child.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.communicate(timeout=5)
    child.kill()
    child.wait()
