"""Tests of the actor runtime: mailboxes, replies, the supervisor.

Anything that waits runs on trio's autojump clock, so timeouts, idle stops and
restart backoffs cost no real time and their timings can be checked exactly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import pytest
import trio
import trio.testing
from trio.testing import wait_all_tasks_blocked

from tidings.actors import (
    Actor,
    ActorStopped,
    Backoff,
    Mailbox,
    MailboxFull,
    Reply,
    open_supervisor,
)

# Restart at once: for tests that are not about the backoff.
NO_BACKOFF = Backoff(initial=0, factor=2, maximum=0, jitter=0)


# --- Messages -------------------------------------------------------------


@dataclass(frozen=True)
class Echo:
    """Answer with ``value``."""

    value: Any
    reply: Reply[Any]


@dataclass(frozen=True)
class Identify:
    """Answer with the serial number of the actor instance handling it."""

    reply: Reply[int]


@dataclass(frozen=True)
class Linger:
    """Sleep ``seconds``, note ``value`` in the journal, then answer with it."""

    seconds: float
    value: Any
    reply: Reply[Any]


@dataclass(frozen=True)
class Ignore:
    """Handled without ever answering."""

    reply: Reply[Any]


@dataclass(frozen=True)
class Explode:
    """Make the handler raise (crash the actor)."""

    reply: Reply[Any] | None = None


@dataclass(frozen=True)
class Hold:
    """Block the handler until ``gate`` is set, then note ``value``."""

    gate: trio.Event
    value: Any = "held"


@dataclass(frozen=True)
class Record:
    """Note ``value`` in the journal; no answer expected."""

    value: Any


# --- Actors ---------------------------------------------------------------


class Worker(Actor[Any]):
    """Handles every message above; notes what it did in a shared journal."""

    def __init__(self, serial: int, journal: list[Any]) -> None:
        self.serial = serial
        self.journal = journal

    async def handle(self, message: Any) -> None:
        match message:
            case Echo(value, reply):
                reply.send(value)
            case Identify(reply):
                reply.send(self.serial)
            case Linger(seconds, value, reply):
                await trio.sleep(seconds)
                self.journal.append(value)
                reply.send(value)
            case Ignore():
                self.journal.append("ignored")
            case Explode():
                raise RuntimeError("boom")
            case Hold(gate, value):
                await gate.wait()
                self.journal.append(value)
            case Record(value):
                self.journal.append(value)
            case _:
                raise AssertionError(f"unexpected message {message!r}")


class Drowsy(Worker):
    idle_timeout = 5


class Ticker(Worker):
    """Owns a periodic loop besides its mailbox; never stops for idleness."""

    idle_timeout = None

    async def run(self, mailbox: Mailbox[Any]) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._tick)
            async for message in mailbox:
                await self.handle(message)
            nursery.cancel_scope.cancel()

    async def _tick(self) -> None:
        while True:
            await trio.sleep(1)
            self.journal.append(("tick", self.serial, trio.current_time()))


class Factory:
    """Builds actors of one class; remembers each call (key and time)."""

    def __init__(self, cls: type[Worker] = Worker) -> None:
        self.cls = cls
        self.journal: list[Any] = []
        self.calls: list[tuple[Any, float]] = []

    def __call__(self, key: Any) -> Worker:
        self.calls.append((key, trio.current_time()))
        return self.cls(len(self.calls), self.journal)

    @property
    def keys(self) -> list[Any]:
        return [key for key, _ in self.calls]

    @property
    def times(self) -> list[float]:
        return [time for _, time in self.calls]


def ask_echo(value: Any) -> Callable[[Reply[Any]], Echo]:
    return lambda reply: Echo(value, reply)


# --- 1. Request / reply ---------------------------------------------------


async def test_ask_returns_the_reply_of_the_actor(autojump_clock: Any) -> None:
    factory = Factory()
    async with open_supervisor("test", factory) as supervisor:
        handle = supervisor.handle("a")
        assert not supervisor.is_running("a")
        assert await handle.ask(ask_echo(1)) == 1
        assert await handle.ask(ask_echo("two")) == "two"
        assert await handle.ask(Identify) == 1
        assert supervisor.is_running("a")
        assert supervisor.running() == ["a"]
    assert factory.keys == ["a"]
    assert supervisor.restarts == 0


async def test_caller_timing_out_leaves_the_actor_alive(autojump_clock: Any) -> None:
    factory = Factory()
    async with open_supervisor("test", factory) as supervisor:
        handle = supervisor.handle("a")
        start = trio.current_time()

        with pytest.raises(trio.TooSlowError):
            with trio.fail_after(1):
                await handle.ask(lambda reply: Linger(10, "first", reply))
        assert trio.current_time() - start == pytest.approx(1)

        # Queued behind the first one, which is still being handled.
        with trio.move_on_after(1) as scope:
            await handle.ask(lambda reply: Linger(10, "second", reply))
        assert scope.cancelled_caught
        assert factory.journal == []

        # Both slow requests are finished (their answers dropped) before this one.
        assert await handle.ask(ask_echo("later")) == "later"
        assert trio.current_time() - start == pytest.approx(20)
        assert factory.journal == ["first", "second"]
        assert await handle.ask(Identify) == 1

    # Answering a caller that had gone did not crash the actor.
    assert supervisor.restarts == 0
    assert len(factory.calls) == 1


async def test_caller_timing_out_on_a_full_mailbox_delivers_nothing(
    autojump_clock: Any,
) -> None:
    factory = Factory()
    gate = trio.Event()
    async with open_supervisor("test", factory, mailbox_size=1) as supervisor:
        handle = supervisor.handle("a")
        handle.try_send(Hold(gate))
        await wait_all_tasks_blocked()
        handle.try_send(Record("queued"))
        with trio.move_on_after(1) as scope:
            await handle.ask(lambda reply: Linger(0, "dropped", reply))
        assert scope.cancelled_caught
        gate.set()
        assert await handle.ask(ask_echo("done")) == "done"
    assert factory.journal == ["held", "queued"]


# --- 2. A handler that never answers --------------------------------------


async def test_handler_that_never_answers_raises_actor_stopped(autojump_clock: Any) -> None:
    factory = Factory()
    async with open_supervisor("test", factory) as supervisor:
        handle = supervisor.handle("a")
        with trio.fail_after(1):  # would jump to the deadline on a hang
            with pytest.raises(ActorStopped):
                await handle.ask(Ignore)
        assert factory.journal == ["ignored"]
        # Not a crash: the same instance keeps answering.
        assert await handle.ask(Identify) == 1
    assert supervisor.restarts == 0


# --- 3. Crashes and restarts ----------------------------------------------


async def test_crash_is_logged_and_a_fresh_actor_handles_the_next_message(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="tidings.actors")
    factory = Factory()
    backoff = Backoff(initial=10, factor=2, maximum=10, jitter=0)
    async with open_supervisor("test", factory, backoff=backoff) as supervisor:
        handle = supervisor.handle("a")
        assert await handle.ask(Identify) == 1
        start = trio.current_time()

        # The crashed request is released at once, not when the next instance starts.
        with trio.fail_after(1):
            with pytest.raises(ActorStopped):
                await handle.ask(Explode)
        assert supervisor.restarts == 1
        assert len(factory.calls) == 1

        assert await handle.ask(Identify) == 2
        assert trio.current_time() - start == pytest.approx(10)
        assert await handle.ask(ask_echo("after")) == "after"
        assert supervisor.restarts == 1
    assert factory.keys == ["a", "a"]

    records = [record for record in caplog.records if record.name == "tidings.actors"]
    assert len(records) == 1
    [record] = records
    assert record.levelno == logging.ERROR
    assert "crashed" in record.getMessage()
    assert "'a'" in record.getMessage()
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], RuntimeError)


async def test_messages_queued_behind_a_crash_are_still_handled(autojump_clock: Any) -> None:
    factory = Factory()
    async with open_supervisor("test", factory, backoff=NO_BACKOFF) as supervisor:
        handle = supervisor.handle("a")
        handle.try_send(Record(1))
        handle.try_send(Explode())
        handle.try_send(Record(2))
        assert await handle.ask(Identify) == 2
    assert factory.journal == [1, 2]
    assert supervisor.restarts == 1


async def test_restart_backoff_grows_exponentially_and_is_capped(autojump_clock: Any) -> None:
    factory = Factory()
    backoff = Backoff(initial=1, factor=2, maximum=4, jitter=0)
    async with open_supervisor("test", factory, mailbox_size=8, backoff=backoff) as supervisor:
        handle = supervisor.handle("a")
        for _ in range(5):
            handle.try_send(Explode())
        assert await handle.ask(Identify) == 6
    assert supervisor.restarts == 5
    times = factory.times
    gaps = [later - earlier for earlier, later in pairwise(times)]
    assert gaps == pytest.approx([1, 2, 4, 4, 4])


async def test_backoff_starts_over_after_a_healthy_run(autojump_clock: Any) -> None:
    factory = Factory()
    backoff = Backoff(initial=1, factor=2, maximum=100, jitter=0, reset_after=10)
    async with open_supervisor("test", factory, backoff=backoff) as supervisor:
        handle = supervisor.handle("a")
        handle.try_send(Explode())
        handle.try_send(Explode())
        assert await handle.ask(Identify) == 3  # after delays of 1 and 2
        await trio.sleep(20)  # the third instance has now been healthy for 20s
        handle.try_send(Explode())
        handle.try_send(Explode())
        assert await handle.ask(Identify) == 5
    times = factory.times
    gaps = [later - earlier for earlier, later in pairwise(times)]
    assert gaps == pytest.approx([1, 2, 20 + 1, 2])


def test_backoff_delay_applies_jitter_within_bounds() -> None:
    backoff = Backoff(initial=1, factor=2, maximum=4, jitter=0.5)
    for failures, base in [(0, 1), (1, 2), (2, 4), (3, 4), (10, 4)]:
        for _ in range(50):
            assert base * 0.5 <= backoff.delay(failures) <= base * 1.5


def test_backoff_delay_stays_capped_after_very_many_failures() -> None:
    backoff = Backoff(initial=0.1, factor=2, maximum=30, jitter=0.1)
    for failures in (1023, 1024, 5000):
        assert 27 <= backoff.delay(failures) <= 33


async def test_a_long_crash_loop_does_not_bring_the_supervisor_down(
    autojump_clock: Any,
) -> None:
    factory = Factory()
    # factor**failures leaves the floats after 31 failures.
    backoff = Backoff(initial=1, factor=1e10, maximum=1, jitter=0)
    with trio.fail_after(100):  # 40 restarts of 1s; a runaway backoff fails here
        async with open_supervisor("test", factory, mailbox_size=64, backoff=backoff) as supervisor:
            handle = supervisor.handle("a")
            for _ in range(40):
                handle.try_send(Explode())
            assert await handle.ask(Identify) == 41
    assert supervisor.restarts == 40


async def test_shutdown_cuts_a_restart_backoff_short(autojump_clock: Any) -> None:
    factory = Factory()
    backoff = Backoff(initial=100, factor=2, maximum=100, jitter=0)
    start = trio.current_time()
    async with open_supervisor("test", factory, backoff=backoff) as supervisor:
        supervisor.handle("a").try_send(Explode())
        await trio.sleep(1)
        assert supervisor.restarts == 1
        assert supervisor.is_running("a")  # waiting out its backoff
    assert trio.current_time() - start == pytest.approx(1)
    assert len(factory.calls) == 1
    assert not supervisor.is_running("a")


# --- 4. Back-pressure -----------------------------------------------------


async def test_full_mailbox_applies_back_pressure(autojump_clock: Any) -> None:
    factory = Factory()
    gate = trio.Event()
    async with open_supervisor("test", factory, mailbox_size=2) as supervisor:
        handle = supervisor.handle("a")
        handle.try_send(Hold(gate))
        await wait_all_tasks_blocked()  # the actor took it and is blocked
        assert supervisor.queued() == 0

        handle.try_send(Record(1))
        handle.try_send(Record(2))
        assert supervisor.queued() == 2
        with pytest.raises(MailboxFull):
            handle.try_send(Record("refused"))
        assert supervisor.queued() == 2

        with trio.move_on_after(1) as scope:
            await handle.send(Record("gave up"))
        assert scope.cancelled_caught

        delivered = trio.Event()

        async def send_third() -> None:
            await handle.send(Record(3))
            delivered.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_third)
            await wait_all_tasks_blocked()
            assert not delivered.is_set()
            gate.set()  # the actor finishes Hold and takes Record(1): room again
            with trio.fail_after(1):
                await delivered.wait()

        assert await handle.ask(ask_echo("end")) == "end"
    assert factory.journal == ["held", 1, 2, 3]
    assert len(factory.calls) == 1


# --- 5. Idle stop ---------------------------------------------------------


async def test_idle_actor_stops_and_a_later_send_starts_a_fresh_one(
    autojump_clock: Any,
) -> None:
    factory = Factory(Drowsy)
    async with open_supervisor("test", factory) as supervisor:
        handle = supervisor.handle("a")
        assert await handle.ask(Identify) == 1
        await trio.sleep(4)
        assert supervisor.is_running("a")
        assert await handle.ask(Identify) == 1  # activity restarts the idle clock
        await trio.sleep(4.9)
        assert supervisor.is_running("a")
        await trio.sleep(0.2)
        assert not supervisor.is_running("a")
        assert supervisor.running() == []
        assert len(factory.calls) == 1

        assert await handle.ask(Identify) == 2
        assert supervisor.is_running("a")
    assert supervisor.restarts == 0
    assert factory.keys == ["a", "a"]


# --- 6. Shutdown ----------------------------------------------------------


async def test_shutdown_finishes_the_current_message_only(autojump_clock: Any) -> None:
    factory = Factory()
    results: dict[str, Any] = {}
    start = trio.current_time()

    with trio.fail_after(100):  # a hang fails instead of blocking forever
        async with trio.open_nursery() as callers:
            async with open_supervisor("test", factory) as supervisor:
                handle = supervisor.handle("a")

                async def call(name: str, make: Callable[[Reply[Any]], Any]) -> None:
                    try:
                        results[name] = await handle.ask(make)
                    except ActorStopped:
                        results[name] = ActorStopped

                callers.start_soon(call, "slow", lambda reply: Linger(5, "slow", reply))
                await wait_all_tasks_blocked()  # the actor is handling it
                callers.start_soon(call, "queued echo", ask_echo("never"))
                callers.start_soon(call, "queued linger", lambda r: Linger(1, "never", r))
                await wait_all_tasks_blocked()
                handle.try_send(Record("never"))
                assert supervisor.queued() == 3
                assert factory.journal == []
            # Leaving the block waited for the current message, and only for it.
            assert trio.current_time() - start == pytest.approx(5)
            assert factory.journal == ["slow"]
            assert not supervisor.is_running("a")
            assert supervisor.running() == []

    assert results == {
        "slow": "slow",
        "queued echo": ActorStopped,
        "queued linger": ActorStopped,
    }
    with pytest.raises(ActorStopped):
        await handle.send(Record("late"))
    with pytest.raises(ActorStopped):
        handle.try_send(Record("late"))
    with pytest.raises(ActorStopped):
        await handle.ask(ask_echo("late"))
    with pytest.raises(ActorStopped):
        supervisor.start("b")
    assert factory.journal == ["slow"]
    assert len(factory.calls) == 1


async def test_shutdown_cut_short_by_a_cancel_scope_releases_every_caller(
    autojump_clock: Any,
) -> None:
    factory = Factory()
    results: dict[str, Any] = {}
    start = trio.current_time()

    with trio.fail_after(100):  # a hang fails instead of blocking forever
        async with trio.open_nursery() as callers:
            with trio.move_on_after(1) as scope:  # bounds the shutdown wait
                async with open_supervisor("test", factory) as supervisor:
                    handle = supervisor.handle("a")

                    async def call(name: str, make: Callable[[Reply[Any]], Any]) -> None:
                        try:
                            results[name] = await handle.ask(make)
                        except ActorStopped:
                            results[name] = ActorStopped

                    callers.start_soon(call, "current", lambda r: Linger(10, "current", r))
                    await wait_all_tasks_blocked()
                    callers.start_soon(call, "queued", ask_echo("queued"))
                    await wait_all_tasks_blocked()
            assert scope.cancelled_caught
            assert trio.current_time() - start == pytest.approx(1)
            assert not supervisor.is_running("a")
            with trio.fail_after(1):  # the callers live outside the scope: none may hang
                while len(results) < 2:
                    await trio.sleep(0.1)

    assert results == {"current": ActorStopped, "queued": ActorStopped}
    assert factory.journal == []


async def test_shutdown_unblocks_senders_waiting_on_a_full_mailbox(
    autojump_clock: Any,
) -> None:
    factory = Factory()
    gate = trio.Event()
    outcome: list[Any] = []

    async def blocked_send(handle: Any) -> None:
        try:
            await handle.send(Record("blocked"))
        except ActorStopped:
            outcome.append(ActorStopped)
        else:
            outcome.append("delivered")

    with trio.fail_after(100):  # a hang fails instead of blocking forever
        async with trio.open_nursery() as callers:
            async with open_supervisor("test", factory, mailbox_size=1) as supervisor:
                handle = supervisor.handle("a")
                handle.try_send(Hold(gate))
                await wait_all_tasks_blocked()
                handle.try_send(Record("queued"))
                callers.start_soon(blocked_send, handle)
                await wait_all_tasks_blocked()
                assert outcome == []
                supervisor.stop()
                gate.set()
    assert factory.journal == ["held"]
    assert outcome == [ActorStopped]


async def test_shutdown_stops_idle_actors_at_once(autojump_clock: Any) -> None:
    factory = Factory()
    start = trio.current_time()
    async with open_supervisor("test", factory) as supervisor:
        for key in "abc":
            assert await supervisor.handle(key).ask(ask_echo(key)) == key
        assert sorted(supervisor.running()) == ["a", "b", "c"]
    assert trio.current_time() == start  # no waiting for the idle timeout
    assert supervisor.running() == []


# --- 7. Independent keys --------------------------------------------------


async def test_keys_run_independently(autojump_clock: Any) -> None:
    factory = Factory()
    gate = trio.Event()
    async with open_supervisor("test", factory) as supervisor:
        supervisor.handle("a").try_send(Hold(gate, "a done"))
        await wait_all_tasks_blocked()
        start = trio.current_time()
        with trio.fail_after(1):  # would jump to the deadline if "b" waited on "a"
            assert await supervisor.handle("b").ask(ask_echo("b")) == "b"
            assert await supervisor.handle("b").ask(ask_echo("b again")) == "b again"
        assert trio.current_time() == start
        assert factory.journal == []  # "a" is still blocked
        assert sorted(supervisor.running()) == ["a", "b"]
        gate.set()
    assert factory.journal == ["a done"]
    assert sorted(factory.keys) == ["a", "b"]


async def test_a_crash_of_one_key_does_not_restart_another(autojump_clock: Any) -> None:
    factory = Factory()
    async with open_supervisor("test", factory, backoff=NO_BACKOFF) as supervisor:
        a, b = supervisor.handle("a"), supervisor.handle("b")
        assert await a.ask(Identify) == 1
        assert await b.ask(Identify) == 2
        with pytest.raises(ActorStopped):
            await a.ask(Explode)
        assert await a.ask(Identify) == 3
        assert await b.ask(Identify) == 2
    assert supervisor.restarts == 1
    assert factory.keys == ["a", "b", "a"]


# --- 8. Actors started without a message ----------------------------------


async def test_start_runs_an_actor_with_its_own_loop_without_any_message(
    autojump_clock: Any,
) -> None:
    factory = Factory(Ticker)
    with trio.fail_after(1100):  # a loop that never stops would tick forever
        async with open_supervisor("test", factory) as supervisor:
            start = trio.current_time()
            supervisor.start("clock")
            supervisor.start("clock")  # already running: no second instance
            assert supervisor.is_running("clock")
            await trio.sleep(3.5)
            assert factory.keys == ["clock"]
            assert factory.journal == [
                ("tick", 1, pytest.approx(start + 1)),
                ("tick", 1, pytest.approx(start + 2)),
                ("tick", 1, pytest.approx(start + 3)),
            ]

            # idle_timeout = None: it is never stopped for idleness.
            await trio.sleep(1000)
            assert supervisor.is_running("clock")
            assert len(factory.journal) == 1003

            # It serves its mailbox too, and shutdown ends its loop at once.
            assert await supervisor.handle("clock").ask(Identify) == 1
            stopped_at = trio.current_time()
    assert trio.current_time() == stopped_at
    assert not supervisor.is_running("clock")
    assert len(factory.journal) == 1003
    assert len(factory.calls) == 1


async def test_a_failing_factory_is_retried_like_a_crash(autojump_clock: Any) -> None:
    attempts: list[float] = []

    def flaky(key: str) -> Actor[Any]:
        attempts.append(trio.current_time())
        if len(attempts) < 3:
            raise RuntimeError("cannot build the actor yet")
        return Worker(len(attempts), [])

    backoff = Backoff(initial=1, factor=2, maximum=10, jitter=0)
    async with open_supervisor("test", flaky, backoff=backoff) as supervisor:
        assert await supervisor.handle("a").ask(Identify) == 3
    assert supervisor.restarts == 2
    assert [later - earlier for earlier, later in pairwise(attempts)] == pytest.approx([1, 2])
