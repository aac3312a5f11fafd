"""The NRI session's watch on the runtime's socket (`EntryWatch`): a creation at any time
after `clear` wakes `wait`, one before it does not (issue 24)."""

from __future__ import annotations

import os

import pytest
import trio
import trio.testing

from dracpu.cgroupfs import inotify
from dracpu.cgroupfs.inotify import EntryWatch


def touch(path: str) -> None:
    with open(path, "w"):
        pass


async def test_a_creation_after_clear_wakes_the_wait_at_once(
    short_tmp: str, autojump_clock: trio.testing.MockClock
) -> None:
    with EntryWatch(short_tmp, "nri.sock") as watch:
        watch.clear()
        touch(os.path.join(short_tmp, "nri.sock"))  # before the wait starts
        start = trio.current_time()
        assert await watch.wait(10.0)
        assert trio.current_time() == start


async def test_a_creation_before_clear_is_not_counted(
    short_tmp: str, autojump_clock: trio.testing.MockClock
) -> None:
    with EntryWatch(short_tmp, "nri.sock") as watch:
        touch(os.path.join(short_tmp, "nri.sock"))
        watch.clear()
        start = trio.current_time()
        assert not await watch.wait(3.0)
        assert trio.current_time() - start == pytest.approx(3.0)


async def test_a_rename_into_place_counts_and_other_names_do_not(
    short_tmp: str, autojump_clock: trio.testing.MockClock
) -> None:
    with EntryWatch(short_tmp, "nri.sock") as watch:
        watch.clear()
        touch(os.path.join(short_tmp, "other.sock"))
        assert not await watch.wait(1.0)
        touch(os.path.join(short_tmp, "tmp"))
        os.rename(os.path.join(short_tmp, "tmp"), os.path.join(short_tmp, "nri.sock"))
        assert await watch.wait(1.0)


async def test_a_creation_during_the_wait_wakes_it(
    short_tmp: str, autojump_clock: trio.testing.MockClock
) -> None:
    with EntryWatch(short_tmp, "nri.sock") as watch:
        watch.clear()

        async def create_later() -> None:
            await trio.sleep(2.0)
            touch(os.path.join(short_tmp, "nri.sock"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(create_later)
            start = trio.current_time()
            assert await watch.wait(30.0)
            assert trio.current_time() - start == pytest.approx(2.0)


async def test_a_directory_made_later_is_watched_once_it_exists(
    short_tmp: str, autojump_clock: trio.testing.MockClock
) -> None:
    directory = os.path.join(short_tmp, "nri")
    with EntryWatch(directory, "nri.sock") as watch:
        watch.clear()

        async def runtime_starts() -> None:
            await trio.sleep(2.5)
            os.mkdir(directory)
            touch(os.path.join(directory, "nri.sock"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(runtime_starts)
            start = trio.current_time()
            assert await watch.wait(30.0)
            # Looked for again every ARM_RETRY (1 s): found at the third look.
            assert trio.current_time() - start == pytest.approx(3.0)


async def test_a_removed_directory_wakes_the_wait(
    short_tmp: str, autojump_clock: trio.testing.MockClock
) -> None:
    directory = os.path.join(short_tmp, "nri")
    os.mkdir(directory)
    with EntryWatch(directory, "nri.sock") as watch:
        watch.clear()
        os.rmdir(directory)
        assert await watch.wait(10.0)


async def test_without_inotify_the_wait_is_a_timer(
    short_tmp: str, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inotify, "open_inotify", lambda: None)
    with EntryWatch(short_tmp, "nri.sock") as watch:
        assert not watch.available
        watch.clear()
        touch(os.path.join(short_tmp, "nri.sock"))
        start = trio.current_time()
        assert not await watch.wait(2.0)
        assert trio.current_time() - start == pytest.approx(2.0)
