"""The demo names pods and claims by namespace/name in its messages, never by UID."""

from __future__ import annotations

from dracpu_sim.demo.uids import UIDNames

POD_UID = "6f1c2d4e-0000-4000-8000-000000000001"
CLAIM_UID = "6f1c2d4e-0000-4000-8000-000000000002"


def _names() -> UIDNames:
    names = UIDNames()
    names.learn("pod", [{"metadata": {"name": "web", "namespace": "team", "uid": POD_UID}}])
    names.learn("claim", [{"metadata": {"name": "four", "namespace": "default", "uid": CLAIM_UID}}])
    return names


def test_the_daemons_bound_message_names_the_pod_and_the_claim() -> None:
    text = (
        f'runtime: plugin dracpu: claimUID "{CLAIM_UID}" already bound to pod "{POD_UID}" '
        'container "app"'
    )
    assert _names().name(text) == (
        'runtime: plugin dracpu: claim default/four already bound to pod team/web container "app"'
    )


def test_bare_uids_and_unknown_ones() -> None:
    names = _names()
    assert names.name(f"pod sandbox {POD_UID} does not exist") == (
        "pod sandbox pod team/web does not exist"
    )
    assert names.name(f"uid {CLAIM_UID}: gone") == "claim default/four: gone"
    assert names.name("claim 1234 is not prepared") == "claim 1234 is not prepared"
    assert UIDNames().name(f"pod {POD_UID}") == f"pod {POD_UID}"


def test_first_name_of_a_uid_is_kept() -> None:
    names = _names()
    names.learn("pod", [{"metadata": {"name": "other", "namespace": "x", "uid": POD_UID}}])
    assert names.name(POD_UID) == "pod team/web"
