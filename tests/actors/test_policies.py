"""Restart policies: backoff, restart intensity and giving up, for keyed actors
and for singletons, on trio's autojump clock."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
import trio

from tests.actors.test_supervisor import Explode, Factory, Identify, Record
from tidings.actors import ActorStopped, Backoff, Intensity, Singleton, open_supervisor
from tidings.actors.runtime import open_runtime
from tidings.webhooks.recording import RecordFailed

STEADY = Backoff(initial=1, factor=2, maximum=8, jitter=0)


def test_an_intensity_needs_a_window() -> None:
    with pytest.raises(ValueError):
        Intensity(restarts=3, within=0)
    with pytest.raises(ValueError):
        Intensity(restarts=-1, within=10)


async def test_a_key_crashing_past_its_intensity_is_given_up_with_its_hook(
    autojump_clock: Any,
) -> None:
    factory = Factory()
    given_up: list[tuple[Any, str, float]] = []

    async def on_give_up(key: Any, error: Exception) -> None:
        given_up.append((key, str(error), trio.current_time()))

    start = trio.current_time()
    async with open_supervisor(
        "test", factory, mailbox_size=16, backoff=STEADY,
        intensity=Intensity(restarts=3, within=60), on_give_up=on_give_up,
    ) as supervisor:
        handle = supervisor.handle("poison")
        for _ in range(5):
            handle.try_send(Explode())
        handle.try_send(Record("never"))
        with trio.fail_after(100):
            while supervisor.is_running("poison"):
                await trio.sleep(0.5)
        # Restarted three times with a growing backoff, then given up on the fourth crash.
        assert supervisor.restarts == 3
        assert supervisor.given_up == 1
        gaps = [later - earlier for earlier, later in pairwise(factory.times)]
        assert gaps == pytest.approx([1, 2, 4])
        assert given_up == [("poison", "boom", pytest.approx(start + 7))]
        assert factory.journal == []  # what was queued behind the crashes was not handled

        # Another key is not affected, and a later message starts a fresh actor.
        assert await supervisor.handle("other").ask(Identify) == 5
        assert await handle.ask(Identify) == 6
    assert supervisor.restarts == 3


async def test_a_request_queued_when_a_key_is_given_up_ends_with_actor_stopped(
    autojump_clock: Any,
) -> None:
    factory = Factory()
    async with open_supervisor(
        "test", factory, backoff=STEADY, intensity=Intensity(restarts=0, within=60)
    ) as supervisor:
        handle = supervisor.handle("a")
        handle.try_send(Explode())
        with trio.fail_after(1):
            with pytest.raises(ActorStopped):
                await handle.ask(Identify)
    assert supervisor.given_up == 1
    assert supervisor.restarts == 0


async def test_crashes_spread_wider_than_the_window_are_restarted_for_ever(
    autojump_clock: Any,
) -> None:
    factory = Factory()
    backoff = Backoff(initial=1, factor=1, maximum=1, jitter=0, reset_after=1000)
    async with open_supervisor(
        "test", factory, backoff=backoff, intensity=Intensity(restarts=2, within=10)
    ) as supervisor:
        handle = supervisor.handle("a")
        for _ in range(6):
            handle.try_send(Explode())
            await trio.sleep(6)  # at most two crashes in any 10 s
        assert await handle.ask(Identify) == 7
    assert supervisor.restarts == 6
    assert supervisor.given_up == 0


async def test_a_failing_give_up_hook_is_logged_and_the_supervisor_goes_on(
    autojump_clock: Any,
) -> None:
    factory = Factory()

    async def broken_hook(key: Any, error: Exception) -> None:
        raise RuntimeError("the hook failed too")

    async with open_supervisor(
        "test", factory, backoff=STEADY, intensity=Intensity(restarts=0, within=60),
        on_give_up=broken_hook,
    ) as supervisor:
        supervisor.handle("a").try_send(Explode())
        await trio.sleep(1)
        assert not supervisor.is_running("a")
        assert await supervisor.handle("b").ask(Identify) == 2
    assert supervisor.given_up == 1


# --- singletons -------------------------------------------------------------


class Flaky:
    """A singleton's body: crashes on its first ``crashes`` runs, then runs until cancelled."""

    def __init__(self, crashes: int) -> None:
        self.crashes = crashes
        self.runs: list[float] = []

    async def run(self) -> None:
        self.runs.append(trio.current_time())
        if len(self.runs) <= self.crashes:
            await trio.sleep(0.5)
            raise RuntimeError(f"crash {len(self.runs)}")
        await trio.sleep_forever()


async def test_a_singleton_is_restarted_with_backoff_and_stopped_with_the_runtime(
    autojump_clock: Any,
) -> None:
    flaky = Flaky(crashes=3)
    async with open_runtime(None) as runtime:  # type: ignore[arg-type]
        child = runtime.singleton("flaky", flaky.run, backoff=STEADY)
        await trio.sleep(100)
        assert child.running() == ["flaky"]
        assert child.restarts == 3
        stopped_at = trio.current_time()
    assert trio.current_time() == stopped_at  # cancelled at once, no waiting
    assert child.running() == []
    # Each run lasted 0.5 s before its crash; then 1, 2, 4 s of backoff.
    gaps = [later - earlier for earlier, later in pairwise(flaky.runs)]
    assert gaps == pytest.approx([1.5, 2.5, 4.5])
    assert child in runtime.children()


async def test_a_singleton_past_its_intensity_is_given_up_with_its_hook(
    autojump_clock: Any,
) -> None:
    flaky = Flaky(crashes=100)
    errors: list[str] = []

    async def on_give_up(error: Exception) -> None:
        errors.append(str(error))

    async with trio.open_nursery() as nursery:
        child = Singleton(
            "flaky", flaky.run, backoff=STEADY,
            intensity=Intensity(restarts=2, within=60), on_give_up=on_give_up,
        )
        child.start(nursery)
        await trio.sleep(1000)
        assert child.running() == []
    assert len(flaky.runs) == 3
    assert child.restarts == 2
    assert child.given_up == 1
    assert errors == ["crash 3"]


async def test_a_singleton_stopped_during_its_backoff_is_not_restarted(
    autojump_clock: Any,
) -> None:
    flaky = Flaky(crashes=1)
    slow = Backoff(initial=100, factor=1, maximum=100, jitter=0)
    async with trio.open_nursery() as nursery:
        child = Singleton("flaky", flaky.run, backoff=slow)
        child.start(nursery)
        await trio.sleep(10)
        stopped_at = trio.current_time()
        child.stop()
    assert trio.current_time() == stopped_at
    assert len(flaky.runs) == 1
    assert child.restarts == 1


async def test_a_singleton_that_returns_is_done(autojump_clock: Any) -> None:
    runs: list[float] = []

    async def once() -> None:
        runs.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        child = Singleton("once", once)
        child.start(nursery)
        await trio.sleep(100)
    assert len(runs) == 1
    assert child.restarts == 0


class FailsWhenCancelled:
    """A child with two tasks, one of which fails as it is cancelled (as a
    database call cut short raises the driver's error)."""

    idle_timeout = None

    def __init__(self) -> None:
        self.runs = 0

    async def _cut_short(self) -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            raise ConnectionRefusedError(111, "Connection refused") from None

    async def run(self, _mailbox: object = None) -> None:
        self.runs += 1
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            nursery.start_soon(self._cut_short)


async def test_a_singleton_failing_as_the_runtime_stops_is_logged_not_raised(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    child = FailsWhenCancelled()
    async with open_runtime(None) as runtime:  # type: ignore[arg-type]
        runtime.singleton("dispatcher", child.run)
        await trio.sleep(1)
    assert child.runs == 1  # stopped, not restarted
    assert any(
        "dispatcher failed as it was stopped" in record.getMessage()
        and isinstance(record.exc_info and record.exc_info[1], BaseExceptionGroup)
        for record in caplog.records
    )


async def test_a_keyed_actor_failing_as_its_shutdown_is_cut_short_is_logged_not_raised(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    child = FailsWhenCancelled()
    with trio.move_on_after(5) as scope:
        async with open_supervisor("endpoints", lambda _key: child) as supervisor:
            supervisor.start("a")
            await trio.sleep(1)
    assert scope.cancelled_caught  # its loop never finished: the scope cut it
    assert child.runs == 1
    assert any("actor endpoints['a'] failed as it was stopped" in record.getMessage()
               for record in caplog.records)


class Outage:
    """A child that cannot reach storage for its first ``crashes`` runs, then runs on."""

    idle_timeout = None

    def __init__(self, crashes: int) -> None:
        self.crashes = crashes
        self.runs: list[float] = []

    async def run(self, _mailbox: object = None) -> None:
        self.runs.append(trio.current_time())
        if len(self.runs) <= self.crashes:
            raise ConnectionRefusedError(111, "Connection refused")
        await trio.sleep_forever()


async def test_a_singleton_retries_at_least_every_second_while_storage_is_down(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    down = Outage(crashes=200)
    async with open_runtime(None) as runtime:  # type: ignore[arg-type]
        runtime.singleton("dispatcher", down.run)  # the default backoff
        await trio.sleep(120)
    gaps = [later - earlier for earlier, later in pairwise(down.runs)]
    # 0.1, 0.2, 0.4, 0.8 s (each ±10 %), then never more than a second.
    assert len(gaps) > 100
    assert max(gaps) == pytest.approx(1)
    # One line for the outage, not a traceback a second.
    assert [r.levelname for r in caplog.records if "dispatcher" in r.getMessage()] == ["WARNING"]
    assert "storage is unavailable (" in caplog.records[0].getMessage()


async def test_crashes_on_a_storage_outage_do_not_give_a_keyed_actor_up(
    autojump_clock: Any,
) -> None:
    down = Outage(crashes=50)
    given_up: list[object] = []

    async def on_give_up(key: object, _error: Exception) -> None:
        given_up.append(key)

    with trio.move_on_after(200):  # its loop ignores the shutdown: the scope ends it
        async with open_supervisor(
            "fanout", lambda _key: down, backoff=STEADY,
            intensity=Intensity(restarts=2, within=60), on_give_up=on_give_up,
        ) as supervisor:
            supervisor.start("b")
            await trio.sleep(100)
            # 50 crashes within 60 s, against an intensity of 2: it runs on.
            assert len(down.runs) == 51
            assert supervisor.is_running("b")
            assert given_up == []
            # Capped at STEADY's outage_retry (1 s), not its 8 s maximum.
            assert max(b - a for a, b in pairwise(down.runs)) == pytest.approx(1)
    assert supervisor.given_up == 0


async def test_each_outage_is_logged_and_a_later_crash_backs_off_afresh(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # Three crashes on an outage, a 20 s run, two more on a second outage,
    # a 20 s run, then a crash of its own.
    script = ["down", "down", "down", 20.0, "down", "down", 20.0, "bug"]
    runs: list[float] = []

    async def child() -> None:
        runs.append(trio.current_time())
        step = script[len(runs) - 1] if len(runs) <= len(script) else None
        if step == "down":
            raise ConnectionRefusedError(111, "Connection refused")
        if step == "bug":
            raise RuntimeError("a bug")
        if isinstance(step, float):
            await trio.sleep(step)
            raise ConnectionRefusedError(111, "Connection refused")
        await trio.sleep_forever()

    async with open_runtime(None) as runtime:  # type: ignore[arg-type]
        runtime.singleton("dispatcher", child, backoff=STEADY)
        await trio.sleep(100)
    levels = [r.levelname for r in caplog.records if "dispatcher" in r.getMessage()]
    # One warning per outage (the runs of 20 s ended with a second and a
    # third), then the bug's traceback.
    assert levels == ["WARNING", "WARNING", "WARNING", "ERROR"]
    # The bug restarts after STEADY's first delay (1 s), not one grown by
    # the outages' crashes before it.
    assert runs[-1] - runs[-2] == pytest.approx(1)


async def test_an_error_raised_from_an_outage_is_an_outage(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch of webhook attempts that could not be written raises
    ``RecordFailed`` from the storage error: still an outage."""
    runs: list[float] = []

    async def child() -> None:
        runs.append(trio.current_time())
        if len(runs) <= 3:
            try:
                raise ConnectionRefusedError(111, "Connection refused")
            except OSError as down:
                raise RecordFailed("the attempts were not recorded") from down
        await trio.sleep_forever()

    async with open_runtime(None) as runtime:  # type: ignore[arg-type]
        runtime.singleton("endpoint", child, backoff=STEADY,
                          intensity=Intensity(restarts=1, within=60))
        await trio.sleep(10)
    assert len(runs) == 4  # not given up after its second crash
    assert [r.levelname for r in caplog.records if "endpoint" in r.getMessage()] == ["WARNING"]
