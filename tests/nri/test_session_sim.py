"""dracpu's NRI session and plugin against the runtime simulator over a real unix socket
(behavior.md §13, protocols.md 6)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing
from nri_sim_node import SimNode, reconnects, sim_node
from owner_steps import unprepare

from dracpu.nri.plugin import EMPTY_SHARED_POOL
from dracpu.nri.session import NRI_API_VERSION
from dracpu_sim.runtime import ContainerCreateError


async def test_lifecycle_shared_then_guaranteed_then_restart(
    short_tmp: str, tmp_path: Path
) -> None:
    async with sim_node(short_tmp, tmp_path / "cg") as node:
        sim = node.sim
        assert node.session.runtime_name == "dracpu-sim"
        # Both sides announce their NRI version, as containerd and the official stub do.
        assert sim.plugin_nri_version == NRI_API_VERSION
        assert node.session.describe()["runtime_nri_version"] == sim.nri_version
        await sim.create_pod("p0", "shared")
        s1 = await sim.create_container("p0", "s1")
        s2 = await sim.create_container("p0", "s2")
        assert sim.cpuset_of(s1) == sim.cpuset_of(s2) == "0-7"

        node.prepare("A", "2-3")
        await sim.create_pod("p1", "guaranteed")
        g1 = await sim.create_container("p1", "app", ["DRA_CPUSET_A=2-3"])
        assert sim.cpuset_of(g1) == "2-3"
        assert sim.cpuset_of(s1) == sim.cpuset_of(s2) == "0-1,4-7"
        cg = tmp_path / "cg" / "cpuset" / "kubepods" / "podp1" / g1 / "cpuset.cpus"
        assert cg.read_text() == "2-3\n"

        # Restart of the claim holder in a live pod: same CPUs, no updates.
        await sim.stop_container(g1)
        await sim.remove_container(g1)
        g2 = await sim.create_container("p1", "app", ["DRA_CPUSET_A=2-3"])
        assert sim.cpuset_of(g2) == "2-3"
        assert node.view.container_of("p1", "app").container_id == g2  # type: ignore[union-attr]

        # New shared containers avoid the claim.
        s3 = await sim.create_container("p0", "s3")
        assert sim.cpuset_of(s3) == "0-1,4-7"
        await sim.remove_pod("p0")
        assert node.view.shared_container_ids() == []
        assert not (tmp_path / "cg" / "cpuset" / "kubepods" / "podp0").exists()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (["DRA_CPUSET_A=0-3"], 'claim "A" is not prepared by this driver'),
        (["DRA_CPUSET_A"], 'malformed DRA env entry "DRA_CPUSET_A"'),
        (["DRA_CPUSET_A=a-b"], 'failed to parse cpuset value "a-b" from env "DRA_CPUSET_A=a-b"'),
    ],
)
async def test_bad_env_fails_creation_and_session_keeps_serving(
    short_tmp: str, tmp_path: Path, env: list[str], message: str
) -> None:
    async with sim_node(short_tmp, tmp_path / "cg") as node:
        await node.sim.create_pod("p1", "pod")
        with pytest.raises(ContainerCreateError) as err:
            await node.sim.create_container("p1", "app", env)
        assert str(err.value).startswith(message)
        assert node.sim.containers == []
        ok = await node.sim.create_container("p1", "app")
        assert node.sim.cpuset_of(ok) == "0-7"
        assert node.sim.plugin_ready


async def test_forged_env_is_refused(short_tmp: str, tmp_path: Path) -> None:
    async with sim_node(short_tmp, tmp_path / "cg") as node:
        node.prepare("A", "0-1")
        await node.sim.create_pod("p1", "owner")
        await node.sim.create_pod("evil", "forger")
        with pytest.raises(ContainerCreateError) as err:
            await node.sim.create_container("evil", "x", ["DRA_CPUSET_A=0-3"])
        assert str(err.value) == (
            'validation failed for claim "A": cpuset mismatch (expected "0-1", got "0-3")'
        )
        await node.sim.create_container("p1", "app", ["DRA_CPUSET_A=0-1"])
        with pytest.raises(ContainerCreateError) as err:
            await node.sim.create_container("evil", "x", ["DRA_CPUSET_A=0-1"])
        assert str(err.value) == 'claimUID "A" already bound to pod "p1" container "app"'


async def test_empty_pool_fails_closed(short_tmp: str, tmp_path: Path) -> None:
    async with sim_node(short_tmp, tmp_path / "cg", node_cpus="0-3") as node:
        node.prepare("A", "0-3")
        await node.sim.create_pod("p1", "pod")
        with pytest.raises(ContainerCreateError) as err:
            await node.sim.create_container("p1", "sidecar")
        assert str(err.value) == EMPTY_SHARED_POOL
        g = await node.sim.create_container("p1", "app", ["DRA_CPUSET_A=0-3"])
        assert node.sim.cpuset_of(g) == "0-3"


async def test_runtime_restart_mid_stream_reconnects_and_resyncs(
    short_tmp: str, tmp_path: Path
) -> None:
    async with sim_node(short_tmp, tmp_path / "cg") as node:
        sim = node.sim
        await sim.create_pod("p0", "shared")
        s1 = await sim.create_container("p0", "s1")
        node.prepare("A", "0-1")

        await sim.restart(downtime=0.05)
        # While the plugin is away a container starts unconfined (behavior.md §18).
        s2 = await sim.create_container("p0", "s2")
        assert sim.cpuset_of(s2) == "0-7"
        assert not node.session.is_synchronized or not sim.plugin_ready

        await sim.wait_plugin_ready()
        await node.session.wait_synchronized()
        assert len(sim.accepted) == 2
        assert reconnects(node.metrics) == 1
        # The resync confined both shared containers to the pool without claim A.
        assert sim.cpuset_of(s1) == sim.cpuset_of(s2) == "2-7"
        assert set(node.view.shared_container_ids()) == {s1, s2}

        await sim.drop_connection()
        await sim.wait_plugin_ready()
        await node.session.wait_synchronized()
        assert reconnects(node.metrics) == 2


async def test_stale_stop_and_remove_after_new_create(short_tmp: str, tmp_path: Path) -> None:
    async with sim_node(short_tmp, tmp_path / "cg") as node:
        sim = node.sim
        node.prepare("A", "4-5")
        await sim.create_pod("p1", "pod")
        old = await sim.create_container("p1", "app", ["DRA_CPUSET_A=4-5"])
        seq = trio.testing.Sequencer()
        ids: list[str] = []

        async def create_new() -> None:
            async with seq(0):
                ids.append(await sim.create_container("p1", "app", ["DRA_CPUSET_A=4-5"]))

        async def stop_old() -> None:
            async with seq(1):
                await sim.stop_container(old)
                await sim.remove_container(old)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_old)
            nursery.start_soon(create_new)
        [new] = ids
        record = node.view.container_of("p1", "app")
        assert record is not None and record.container_id == new
        assert node.view.owner_of("A") is not None
        assert [i.container_id for i in node.plugin.intents() if not i.sandbox] == [new]
        assert sim.cpuset_of(new) == "4-5"


async def test_remove_through_state_change_on_old_runtimes(short_tmp: str, tmp_path: Path) -> None:
    async with sim_node(
        short_tmp, tmp_path / "cg", sim_kw={"remove_via_state_change": True}
    ) as node:
        await node.sim.create_pod("p1", "pod")
        c = await node.sim.create_container("p1", "app")
        # Make Stop look stale so only the StateChange removal can forget the container.
        node.state.drop_container("p1", "app", c)
        node.plugin.create_container(node.sim._pods["p1"].proto(), node.sim.container(c).proto())
        await node.sim.remove_container(c)
        assert len(node.view.containers()) == 0


async def test_synchronize_500_containers_in_pages(short_tmp: str, tmp_path: Path) -> None:
    async with sim_node(
        short_tmp, tmp_path / "cg", start_session=False, sim_kw={"sync_page_size": 120}
    ) as node:
        sim = node.sim
        node.prepare("A", "0-1")
        node.prepare("B", "2")
        ids: list[str] = []
        for p in range(50):
            await sim.create_pod(f"p{p}", f"pod{p}")
            for c in range(10):
                env = []
                if (p, c) == (0, 0):
                    env = ["DRA_CPUSET_A=0-1"]
                elif (p, c) == (1, 0):
                    env = ["DRA_CPUSET_B=2"]
                ids.append(await sim.create_container(f"p{p}", f"c{c}", env))
        assert all(sim.cpuset_of(i) == "0-7" for i in ids)

        node.start_session()
        await sim.wait_plugin_ready()
        assert node.session.is_synchronized
        assert [more for _, _, more in sim.sync_chunks] == [True] * 4 + [False]
        assert sum(c for _, c, _ in sim.sync_chunks) == 500
        assert sum(p for p, _, _ in sim.sync_chunks) == 50
        assert sim.cpuset_of(ids[0]) == "0-1"
        assert sim.cpuset_of(ids[10]) == "2"
        assert {sim.cpuset_of(i) for i in ids[1:10] + ids[11:]} == {"3-7"}
        assert len(node.view.shared_container_ids()) == 498


async def test_update_containers_success_and_failures(short_tmp: str, tmp_path: Path) -> None:
    async with sim_node(short_tmp, tmp_path / "cg") as node:
        sim = node.sim
        node.prepare("A", "0-3")
        await sim.create_pod("p0", "shared")
        s1 = await sim.create_container("p0", "s1")
        s2 = await sim.create_container("p0", "s2")
        assert sim.cpuset_of(s1) == "4-7"

        await unprepare(node.state, "A")
        updates = node.plugin.shared_pool_updates()
        assert await node.session.update_containers(updates) == []
        assert sim.cpuset_of(s1) == sim.cpuset_of(s2) == "0-7"

        sim.fail_updates(1)
        reasons = await node.session.update_containers(updates)
        assert [r.intent.container_id for r in reasons] == [s1, s2]
        assert reasons[0].why == "UpdateContainers failed: simulated UpdateContainers failure"
        assert reasons[0].intent.cgroups_path == f"/kubepods/podp0/{s1}"
        assert reasons[0].intent.cpus == "0-7"

        sim.mark_failed_updates(1)
        reasons = await node.session.update_containers(updates)
        assert [r.intent.container_id for r in reasons] == [s1, s2]
        assert {r.reason for r in reasons} == {"listed as failed by the runtime"}

        # A container that stopped while its update was on the way is reported by the
        # runtime as failed (ignore_failure); the plugin forgot it at StopContainer, so
        # nothing is retried through cgroupfs for it.
        await sim.stop_container(s2)
        assert await node.session.update_containers(updates) == []
        assert sim.update_requests[-1] == [s1, s2]
        assert len(sim.update_requests) == 4


async def test_update_containers_when_session_down(short_tmp: str, tmp_path: Path) -> None:
    async with sim_node(short_tmp, tmp_path / "cg", start_session=False) as node:
        await node.sim.create_pod("p0", "shared")
        node.plugin.create_container(
            node.sim._pods["p0"].proto(),
            node.sim.container(await node.sim.create_container("p0", "s1")).proto(),
        )
        updates = node.plugin.shared_pool_updates()
        [msg] = await node.session.update_containers(updates)
        assert msg.intent.container_id == updates[0].container_id
        assert msg.reason == "NRI session down"


async def test_update_containers_timeout(
    short_tmp: str, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with sim_node(short_tmp, tmp_path / "cg") as node:
        await node.sim.create_pod("p0", "shared")
        await node.sim.create_container("p0", "s1")
        node.sim.drop_updates(1)
        start = trio.current_time()
        failed = await node.session.update_containers(node.plugin.shared_pool_updates())
        assert trio.current_time() - start == pytest.approx(2.0)
        assert [f.reason for f in failed] == ["timed out"]
        # The session stays up and the next update goes through.
        assert await node.session.update_containers(node.plugin.shared_pool_updates()) == []


@asynccontextmanager
async def unstarted_node_with_fixed_backoff(
    short_tmp: str, tmp_path: Path
) -> AsyncIterator[tuple[SimNode, trio.SocketListener, float]]:
    """A node whose session is not started yet and, once started, retries a refused dial
    after 1, 2, 4, 8, 8... s (no jitter); with the runtime's listener and the start time."""
    async with sim_node(
        short_tmp,
        tmp_path / "cg",
        start_session=False,
        session_kw={"reconnect_backoff": (1.0, 8.0), "rand": lambda: 1.0},
    ) as node:
        start = trio.current_time()
        listener = node.sim._listener
        assert listener is not None
        yield node, listener, start


async def test_reconnect_backoff_under_mock_clock(
    short_tmp: str, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with unstarted_node_with_fixed_backoff(short_tmp, tmp_path) as (node, _, start):
        sim = node.sim
        # Take the socket away: every dial fails until it comes back at t=20.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sim.restart, 20.0)
            await trio.sleep(0)
            node.start_session()
        await sim.wait_plugin_ready()
        # The socket is gone: no backoff schedule, the session dials the moment the
        # runtime binds it again (t=20), not at the next backoff step (t=23).
        assert sim.accepted == [pytest.approx(start + 20.0)]
        assert reconnects(node.metrics) == 0


async def test_a_refusing_socket_bound_again_in_place_is_dialled_at_once(
    short_tmp: str, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with unstarted_node_with_fixed_backoff(short_tmp, tmp_path) as (node, listener, start):
        sim = node.sim
        # The socket file stays but nobody listens: dials at 0, 1, 3, 7, 15 are refused.
        sim._listener = None
        await listener.aclose()
        node.start_session()
        await trio.sleep(18.0)
        await sim._listen()  # bound in place again at t=18: dial at once, not at 23
        await sim.wait_plugin_ready()
        assert sim.accepted == [pytest.approx(start + 18.0)]


async def test_a_socket_bound_again_just_after_a_refused_dial_is_dialled_at_once(
    short_tmp: str,
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 24: the runtime binds its socket again after our dial was refused and before
    we start waiting. The watch that wakes the retry must already be there: dialled
    within 200 ms, not at the next backoff step (1 s here)."""
    async with unstarted_node_with_fixed_backoff(short_tmp, tmp_path) as (node, listener, _):
        sim = node.sim
        sim._listener = None
        await listener.aclose()  # the socket file stays, nobody listens: refused
        dial = node.session._dial
        rebound: list[float] = []

        async def dial_then_rebind() -> trio.SocketStream:
            try:
                return await dial()
            except ConnectionRefusedError:
                if not rebound:
                    await sim._listen()  # between the refusal and the wait
                    rebound.append(trio.current_time())
                raise

        monkeypatch.setattr(node.session, "_dial", dial_then_rebind)
        node.start_session()
        await sim.wait_plugin_ready()
        [accepted] = sim.accepted
        assert 0 <= accepted - rebound[0] < 0.2


async def test_a_runtime_restart_seen_only_after_the_session_ends_is_dialled_at_once(
    short_tmp: str,
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same gap after a session: the socket is bound again in place between the end
    of the session and the wait; the watch kept from before the dial sees it."""
    async with sim_node(
        short_tmp,
        tmp_path / "cg",
        start_session=False,
        session_kw={"reconnect_backoff": (1.0, 8.0), "rand": lambda: 1.0},
    ) as node:
        sim = node.sim
        serve = node.session._serve
        rebound: list[float] = []

        async def serve_then_rebind(stream: trio.SocketStream) -> tuple[str, bool]:
            result = await serve(stream)
            if not rebound:
                listener = sim._listener
                assert listener is not None
                sim._listener = None
                await listener.aclose()
                await sim._listen()  # between the end of the session and the wait
                rebound.append(trio.current_time())
            return result

        monkeypatch.setattr(node.session, "_serve", serve_then_rebind)
        node.start_session()
        await sim.wait_plugin_ready()
        await sim.drop_connection()
        await sim.wait_plugin_ready()
        assert len(sim.accepted) == 2
        assert 0 <= sim.accepted[1] - rebound[0] < 0.2


async def test_a_creation_seen_before_a_dial_does_not_skip_the_next_backoff(
    short_tmp: str, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The socket appearing wakes the first dial; once that session ends with the socket
    unchanged, the retry waits out its backoff (the old creation is not counted twice)."""
    async with unstarted_node_with_fixed_backoff(short_tmp, tmp_path) as (node, _, start):
        sim = node.sim
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sim.restart, 5.0)
            await trio.sleep(0)
            node.start_session()
        await sim.wait_plugin_ready()
        assert sim.accepted == [pytest.approx(start + 5.0)]
        dropped = trio.current_time()
        await sim.drop_connection()
        await sim.wait_plugin_ready()
        # The first failure after a synchronized session: 1 s (no jitter).
        assert sim.accepted[1] - dropped == pytest.approx(1.0, abs=0.01)


async def test_backoff_resets_after_a_synchronized_session(
    short_tmp: str, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with sim_node(
        short_tmp,
        tmp_path / "cg",
        session_kw={"reconnect_backoff": (1.0, 8.0), "rand": lambda: 0.0},
    ) as node:
        t0 = trio.current_time()
        await node.sim.drop_connection()
        await node.sim.wait_plugin_ready()
        # The first delay after a good session is the initial one, jittered to 50 %.
        assert node.sim.accepted[-1] - t0 == pytest.approx(0.5)
        assert reconnects(node.metrics) == 1


async def test_unsolicited_update_waits_for_a_runtime_event_without_deadlock(
    short_tmp: str, tmp_path: Path
) -> None:
    """Our UpdateContainers may be in flight while the runtime calls us: the session keeps
    answering (its read loop never waits on its own calls) and both complete."""
    async with sim_node(short_tmp, tmp_path / "cg") as node:
        sim = node.sim
        await sim.create_pod("p0", "shared")
        s1 = await sim.create_container("p0", "s1")
        node.prepare("A", "0-1")
        results: dict[str, object] = {}

        async def update() -> None:
            results["failed"] = await node.session.update_containers(
                node.plugin.shared_pool_updates()
            )

        async def create() -> None:
            results["g"] = await sim.create_container("p0", "g", ["DRA_CPUSET_A=0-1"])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(create)
            nursery.start_soon(update)
        assert results["failed"] == []
        assert sim.cpuset_of(str(results["g"])) == "0-1"
        assert sim.cpuset_of(s1) == "2-7"
        assert sim.plugin_ready


async def test_register_reply_after_synchronize(short_tmp: str, tmp_path: Path) -> None:
    """A live runtime may Configure and Synchronize before its RegisterPlugin reply."""
    async with sim_node(
        short_tmp, tmp_path / "cg", start_session=False, sim_kw={"register_reply_after_sync": True}
    ) as node:
        await node.sim.create_pod("p0", "shared")
        s1 = await node.sim.create_container("p0", "s1")
        node.prepare("A", "0-3")
        node.start_session()
        await node.sim.wait_plugin_ready()
        await node.session.wait_synchronized()
        assert node.sim.cpuset_of(s1) == "4-7"
        s2 = await node.sim.create_container("p0", "s2")
        assert node.sim.cpuset_of(s2) == "4-7"


async def test_each_hook_logs_under_one_operation_id(short_tmp: str, tmp_path: Path) -> None:
    """behavior.md §16.1: Synchronize, CreateContainer, StopContainer and RemoveContainer
    each log `begin: ...` and `end: ...` lines sharing one opID."""
    import io
    import json
    import logging

    from dracpu.logs import setup_logging

    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    out = io.StringIO()
    setup_logging("json", 2, out)
    try:
        async with sim_node(short_tmp, tmp_path / "cg") as node:
            await node.sim.create_pod("p0", "shared")
            c1 = await node.sim.create_container("p0", "app")
            await node.sim.remove_container(c1)
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    ops: dict[str, list[str]] = {}
    for line in lines:
        if "opID" in line:
            ops.setdefault(line["opID"], []).append(line["msg"])
    begins = {msgs[0] for msgs in ops.values() if msgs[0].startswith("begin: ")}
    assert begins >= {
        "begin: synchronize state with the runtime",
        "begin: CreateContainer",
        "begin: StopContainer",
        "begin: RemoveContainer",
    }
    for msgs in ops.values():
        if msgs[0].startswith("begin: "):
            assert msgs[-1] == "end: " + msgs[0].removeprefix("begin: ")
