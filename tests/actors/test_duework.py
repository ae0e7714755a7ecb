"""The due-work runtime against a real PostgreSQL, on trio's autojump clock.

A table of test jobs is leased with the statements of ``leases.py``, its
"now" being trio's virtual clock (passed as a parameter), so that due times
and lease expiries follow the MockClock. The clock runs with
``autojump_threshold=0`` except while the database works: a round trip is
real I/O, during which the clock holds still (otherwise asyncpg's own
timers, which trio-asyncio runs on trio's clock, would fire at once).
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from contextvars import ContextVar
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
import trio
import trio.testing
import triopg

from tidings.actors.duework import Batch, DueWork, LeasedWorker, open_listener
from tidings.actors.policy import Backoff, Intensity
from tidings.actors.runtime import Runtime, open_runtime
from tidings.storage.connection import AsyncioConnection
from tidings.storage.db import Database, UnitPool, open_unit_pool
from tidings.storage.leases import keys_of, lease_sql, owners_of

CHANNEL = "test_jobs_due"
SCHEMA = """
CREATE TABLE test_owners (id uuid PRIMARY KEY, status text NOT NULL DEFAULT 'active');
CREATE TABLE test_jobs (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    owner uuid NOT NULL REFERENCES test_owners (id),
    due_at timestamptz NOT NULL,
    done_at timestamptz,
    done_by uuid,
    attempts integer NOT NULL DEFAULT 0,
    lease_owner uuid,
    leased_until timestamptz
);
"""
# $1 is the virtual now, in seconds, in every statement that reads the clock.
LEASES = lease_sql(
    "test_jobs",
    owner="owner",
    extra=1,
    now="to_timestamp($1)",
    due="t.due_at",
    pending="""t.done_at IS NULL AND EXISTS (
        SELECT 1 FROM test_owners o WHERE o.id = t.owner AND o.status = 'active')""",
    record_set="done_at = to_timestamp($3), done_by = $2, attempts = t.attempts + 1",
)
LEASE_SECONDS = 10.0
FAST = Backoff(initial=1, factor=2, maximum=8, jitter=0)


class Still:
    """Holds the autojump clock still while real I/O (the database) runs."""

    def __init__(self, clock: trio.testing.MockClock) -> None:
        self.clock = clock
        self.depth = 0

    @contextmanager
    def io(self) -> Iterator[None]:
        self.depth += 1
        self.clock.autojump_threshold = math.inf
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0:
                self.clock.autojump_threshold = 0


virtual_now: ContextVar[float] = ContextVar("virtual_now")


class StillDatabase(Database):
    def __init__(self, pool: Any, units: UnitPool, url: str, still: Still) -> None:
        super().__init__(pool, units, url)
        self.still = still

    async def run(self, unit: Any, *args: Any) -> Any:
        # Units run on the storage loop's thread, away from trio: they read
        # the virtual clock's time from here.
        virtual_now.set(trio.current_time())
        with self.still.io():
            return await super().run(unit, *args)

    async def sql(self, query: str, *args: Any) -> list[Any]:
        async def unit(conn: AsyncioConnection) -> list[Any]:
            return list(await conn.fetch(query, *args))

        return await self.run(unit)  # type: ignore[no-any-return]

    def listen(self, url: str, channel: str) -> Any:
        """The runtime's LISTEN connections, opened and closed with the clock still."""

        @asynccontextmanager
        async def listening() -> AsyncIterator[Any]:
            stack = AsyncExitStack()
            with self.still.io():
                payloads = await stack.enter_async_context(open_listener(url, channel))
            try:
                yield payloads
            finally:
                with self.still.io():
                    await stack.aclose()

        return listening()


@pytest.fixture
def clock() -> trio.testing.MockClock:
    # Still while the fixtures set the database up; the tests turn autojump on.
    return trio.testing.MockClock(autojump_threshold=math.inf)


@pytest.fixture
async def db(clock: trio.testing.MockClock, database_url: str) -> AsyncIterator[StillDatabase]:
    async with triopg.connect(database_url) as conn:
        await conn.execute(SCHEMA)
    still = Still(clock)
    async with (
        triopg.create_pool(database_url, min_size=1, max_size=6) as pool,
        open_unit_pool(database_url, 6) as units,
    ):
        database = StillDatabase(pool, units, database_url, still)
        clock.autojump_threshold = 0
        try:
            yield database
        finally:
            clock.autojump_threshold = math.inf


async def add_jobs(
    db: StillDatabase, owner: UUID, *delays: float, notify: bool = False
) -> list[UUID]:
    """Jobs of ``owner`` due ``delays`` seconds from now (virtual)."""
    now = trio.current_time()
    rows = await db.sql(
        """
        WITH o AS (INSERT INTO test_owners (id) VALUES ($1) ON CONFLICT DO NOTHING),
        jobs AS (
            INSERT INTO test_jobs (owner, due_at)
            SELECT $1, to_timestamp($2 + delay) FROM unnest($3::float8[]) AS delay
            RETURNING id
        )
        SELECT id, CASE WHEN $4 THEN pg_notify($5, $1::text) END FROM jobs
        """,
        owner, now, list(delays), notify, CHANNEL,
    )
    return [row["id"] for row in rows]


class JobOfOwner:
    """Performs a job by noting who did it and when; may take time, hang or crash."""

    lease_seconds = LEASE_SECONDS

    def __init__(self, db: StillDatabase, owner: UUID, worker: Worker) -> None:
        self._db = db
        self._owner = owner
        self._worker = worker

    @asynccontextmanager
    async def open(self) -> AsyncIterator[object]:
        yield None

    async def claim(self, limit: int) -> Batch[UUID]:
        async def unit(conn: AsyncioConnection) -> Batch[UUID]:
            now = virtual_now.get()
            args = (now, self._owner, self._worker.id, LEASE_SECONDS, limit)
            rows = await conn.fetch(LEASES.claim, *args)
            seconds = await conn.fetchval(LEASES.seconds_to_next_due, now, self._owner)
            return Batch([row["id"] for row in rows], seconds)

        return await self._db.run(unit)  # type: ignore[no-any-return]

    async def perform(self, item: UUID) -> float:
        self._worker.performed.append((item, trio.current_time()))
        if self._owner in self._worker.poison:
            raise RuntimeError("this owner's data crashes its actor")
        if self._worker.hang:
            await trio.sleep_forever()
        await trio.sleep(self._worker.seconds_of.get(item, self._worker.work_seconds))
        self._worker.finished.append(item)
        return trio.current_time()

    async def record(self, done: Sequence[tuple[UUID, float]]) -> None:
        if self._worker.failing_records > 0:
            self._worker.failing_records -= 1
            raise ConnectionRefusedError("storage is down (as the test has it)")
        async def unit(conn: AsyncioConnection) -> None:
            await conn.executemany(
                LEASES.record, [(item, self._worker.id, at) for item, at in done]
            )

        await self._db.run(unit)

    async def release(self, items: Sequence[UUID]) -> None:
        if self._worker.hang:
            return  # a process that hangs (or died) gives nothing back

        async def unit(conn: AsyncioConnection) -> None:
            await conn.execute(LEASES.release, list(items), self._worker.id)

        await self._db.run(unit)
        await trio.sleep(self._worker.slow_release)


class Worker:
    """One "process": its lease owner id and what its actors performed."""

    def __init__(
        self, *, work_seconds: float = 0.0, hang: bool = False, poison: set[UUID] | None = None,
        slow_release: float = 0.0,
    ) -> None:
        self.id = uuid4()
        self.work_seconds = work_seconds
        self.hang = hang
        self.slow_release = slow_release  # seconds a release takes after it gave rows back
        self.poison = poison or set()
        self.performed: list[tuple[UUID, float]] = []
        self.finished: list[UUID] = []  # performed to their end
        self.seconds_of: dict[UUID, float] = {}  # a job's own time, else work_seconds
        self.failing_records = 0  # records that fail, as in an outage, before they work
        self.given_up: list[UUID] = []

    def register(
        self, runtime: Runtime, db: StillDatabase, *, poll_seconds: float,
        intensity: Intensity | None = None,
    ) -> Any:
        async def due(conn: AsyncioConnection, limit: int) -> list[UUID]:
            return owners_of(await conn.fetch(LEASES.due_owners, virtual_now.get(), limit))

        async def on_give_up(owner: UUID, error: Exception) -> None:
            self.given_up.append(owner)
            await db.sql("UPDATE test_owners SET status = 'failed' WHERE id = $1", owner)

        return runtime.due(
            DueWork(
                name="test-jobs",
                channel=CHANNEL,
                due=due,
                parse=UUID,
                actor=lambda owner: LeasedWorker(
                    JobOfOwner(db, owner, self), concurrency=4, idle_seconds=30
                ),
                poll_seconds=poll_seconds,
                backoff=FAST,
                intensity=intensity,
                on_give_up=on_give_up,
            )
        )


async def jobs(db: StillDatabase) -> dict[UUID, Any]:
    rows = await db.sql(
        "SELECT id, extract(epoch FROM done_at)::float8 AS done_at, done_by, attempts,"
        " lease_owner FROM test_jobs"
    )
    return {row["id"]: row for row in rows}


async def wait_done(db: StillDatabase, count: int, within: float) -> dict[UUID, Any]:
    deadline = trio.current_time() + within
    while True:
        found = await jobs(db)
        if sum(1 for row in found.values() if row["done_at"] is not None) >= count:
            return found
        assert trio.current_time() < deadline, "the jobs were not done in time"
        await trio.sleep(0.25)


async def test_due_work_is_done_on_time_when_announced(
    db: StillDatabase, clock: trio.testing.MockClock
) -> None:
    worker = Worker()
    a, b = uuid4(), uuid4()
    async with open_runtime(db, listen=db.listen) as runtime:
        # The poll would take 1000 s: the NOTIFY and the actor's own timer do it all.
        worker.register(runtime, db, poll_seconds=1000)
        await trio.sleep(1)  # the dispatcher connects and polls once
        start = trio.current_time()
        first = await add_jobs(db, a, 0, 10, 25, notify=True)
        second = await add_jobs(db, b, 5, notify=True)
        done = await wait_done(db, 4, within=100)
        runtime.stop()
    due = dict(zip(first + second, [0, 10, 25, 5], strict=True))
    for job, delay in due.items():
        assert done[job]["done_by"] == worker.id
        assert done[job]["attempts"] == 1
        # Not early, and on time: within the clock's granularity of a round trip.
        assert start + delay <= done[job]["done_at"] <= start + delay + 1
    assert Counter(job for job, _ in worker.performed) == dict.fromkeys(due, 1)


async def test_due_work_nobody_announced_is_found_by_the_poll(
    db: StillDatabase, clock: trio.testing.MockClock
) -> None:
    worker = Worker()
    owners = [uuid4() for _ in range(3)]
    start = trio.current_time()
    made = [job for n, owner in enumerate(owners) for job in await add_jobs(db, owner, 3 * n)]
    async with open_runtime(db, listen=db.listen) as runtime:
        worker.register(runtime, db, poll_seconds=2)
        done = await wait_done(db, len(made), within=60)
        runtime.stop()
    for n, job in enumerate(made):
        assert start + 3 * n <= done[job]["done_at"] <= start + 3 * n + 2.5


async def test_an_expired_lease_is_taken_over_by_another_owner(
    db: StillDatabase, clock: trio.testing.MockClock
) -> None:
    dead = Worker(hang=True)  # claims, then dies: records nothing, releases nothing
    healthy = Worker()
    owner = uuid4()
    [job] = await add_jobs(db, owner, 0)
    with trio.CancelScope() as first_process:
        async with open_runtime(db, listen=db.listen) as first:
            dead.register(first, db, poll_seconds=1)
            while not dead.performed:
                await trio.sleep(0.1)
            first_process.cancel()
    [(_job, claimed_at)] = dead.performed
    assert (await jobs(db))[job]["lease_owner"] == dead.id

    async with open_runtime(db, listen=db.listen) as second:
        healthy.register(second, db, poll_seconds=1)
        await trio.sleep(LEASE_SECONDS / 2)
        assert (await jobs(db))[job]["done_at"] is None  # the lease still holds
        done = await wait_done(db, 1, within=30)
        second.stop()
    assert done[job]["done_by"] == healthy.id
    assert done[job]["attempts"] == 1
    [(taken, taken_at)] = healthy.performed
    assert taken == job
    assert claimed_at + LEASE_SECONDS <= taken_at <= claimed_at + LEASE_SECONDS + 1.5

    # The dead owner, were it to come back, could record nothing: the lease is not its.
    async def late(conn: AsyncioConnection) -> Any:
        return await conn.fetchval(LEASES.record, job, dead.id, virtual_now.get())

    assert await db.run(late) == 0
    assert (await jobs(db))[job]["done_by"] == healthy.id


async def test_two_owners_share_the_work_and_never_do_a_job_twice(
    db: StillDatabase, clock: trio.testing.MockClock
) -> None:
    one, two = Worker(work_seconds=0.5), Worker(work_seconds=0.5)
    owners = [uuid4() for _ in range(4)]
    delays = [0] * 8 + [5] * 8
    made = [job for owner in owners for job in await add_jobs(db, owner, *delays)]
    async with (
        open_runtime(db, listen=db.listen) as first,
        open_runtime(db, listen=db.listen) as second,
    ):
        one.register(first, db, poll_seconds=0.5)
        two.register(second, db, poll_seconds=0.5)
        done = await wait_done(db, len(made), within=120)
        first.stop()
        second.stop()
    assert {row["attempts"] for row in done.values()} == {1}
    performed = [job for job, _ in one.performed + two.performed]
    assert sorted(performed) == sorted(made)
    assert one.performed and two.performed


async def test_a_record_that_storage_fails_cuts_no_row_in_flight_short(
    db: StillDatabase, clock: trio.testing.MockClock
) -> None:
    """A quick row is done and its record fails (storage down) while a slow
    one is still under way: the slow one goes on to its end (a send cut
    short would go out again), and both are recorded once storage answers,
    each performed once."""
    worker = Worker()
    owner = uuid4()
    quick, slow = await add_jobs(db, owner, 0, 0)
    worker.seconds_of = {quick: 0.1, slow: 3.0}
    worker.failing_records = 1
    async with open_runtime(db, listen=db.listen) as runtime:
        worker.register(runtime, db, poll_seconds=0.5)
        done = await wait_done(db, 2, within=60)
        runtime.stop()
    assert Counter(job for job, _ in worker.performed) == {quick: 1, slow: 1}
    assert sorted(worker.finished) == sorted([quick, slow])
    assert {row["attempts"] for row in done.values()} == {1}
    assert worker.failing_records == 0


async def test_an_owner_whose_actor_keeps_crashing_is_given_up(
    db: StillDatabase, clock: trio.testing.MockClock
) -> None:
    poison, fine = uuid4(), uuid4()
    worker = Worker(poison={poison})
    [bad] = await add_jobs(db, poison, 0)
    [good] = await add_jobs(db, fine, 0)
    async with open_runtime(db, listen=db.listen) as runtime:
        due = worker.register(
            runtime, db, poll_seconds=1, intensity=Intensity(restarts=2, within=60)
        )
        await wait_done(db, 1, within=30)
        while not worker.given_up:
            await trio.sleep(0.5)
        await trio.sleep(30)  # given up: no dispatcher poll wakes it again
        runtime.stop()
    assert worker.given_up == [poison]
    attempts = [at for job, at in worker.performed if job == bad]
    assert len(attempts) == 3  # the first run and two restarts
    gaps = [later - earlier for earlier, later in zip(attempts, attempts[1:], strict=False)]
    assert all(gap >= 1 for gap in gaps)  # each restart waited out its backoff
    assert due.owners.given_up == 1
    state = await jobs(db)
    assert state[good]["done_at"] is not None
    assert state[bad]["done_at"] is None and state[bad]["lease_owner"] is None
    [row] = await db.sql("SELECT status FROM test_owners WHERE id = $1", poison)
    assert row["status"] == "failed"


async def test_a_row_that_crashes_its_actor_is_not_claimed_again_on_the_way_down(
    db: StillDatabase, clock: trio.testing.MockClock
) -> None:
    poison = uuid4()
    # The row is back in the table while its release still runs, and the
    # dispatcher's poll wakes the actor meanwhile: it must not claim it again.
    worker = Worker(poison={poison}, slow_release=1.5)
    [bad] = await add_jobs(db, poison, 0)
    async with open_runtime(db, listen=db.listen) as runtime:
        worker.register(runtime, db, poll_seconds=0.5, intensity=Intensity(restarts=1, within=60))
        while not worker.given_up:
            await trio.sleep(0.5)
        runtime.stop()
    attempts = [at for job, at in worker.performed if job == bad]
    assert len(attempts) == 2  # the first run and one restart, each performed once


async def test_renew_extends_only_the_leases_still_held(
    db: StillDatabase, clock: trio.testing.MockClock
) -> None:
    owner, holder, other = uuid4(), uuid4(), uuid4()
    jobs_made = await add_jobs(db, owner, 0, 0)
    now = trio.current_time()

    async def claim(conn: AsyncioConnection, by: UUID, limit: int) -> list[UUID]:
        rows = await conn.fetch(LEASES.claim, now, owner, by, LEASE_SECONDS, limit)
        return [row["id"] for row in rows]

    mine = await db.run(claim, holder, 1)
    theirs = await db.run(claim, other, 5)
    assert len(mine) == 1 and sorted(mine + theirs) == sorted(jobs_made)

    async def renew(conn: AsyncioConnection) -> list[UUID]:
        return keys_of(await conn.fetch(LEASES.renew, now, jobs_made, holder, 100.0))

    assert await db.run(renew) == mine
    [row] = await db.sql(
        "SELECT extract(epoch FROM leased_until)::float8 AS until FROM test_jobs WHERE id = $1",
        mine[0],
    )
    assert row["until"] == pytest.approx(now + 100)


async def test_renew_never_waits_for_a_row_another_statement_holds(
    db: StillDatabase, clock: trio.testing.MockClock, database_url: str
) -> None:
    """A renewal that waited for a row being recorded could deadlock with that
    recording (each locking rows of one batch in its own order): the send
    worker's record then rolled back and its emails were sent again."""
    owner, holder = uuid4(), uuid4()
    await add_jobs(db, owner, 0, 0)
    now = trio.current_time()

    async def scenario(conn: AsyncioConnection) -> tuple[bool, list[float]]:
        claimed = [row["id"] for row in await conn.fetch(
            LEASES.claim, now, owner, holder, LEASE_SECONDS, 2)]
        busy, free = claimed
        other = await asyncpg.connect(database_url)
        try:
            async with other.transaction():
                await other.execute("SELECT 1 FROM test_jobs WHERE id = $1 FOR UPDATE", busy)
                kept = keys_of(await asyncio.wait_for(
                    conn.fetch(LEASES.renew, now, claimed, holder, 100.0), 5))
        finally:
            await other.close()
        rows = await conn.fetch(
            "SELECT extract(epoch FROM leased_until)::float8 AS until FROM test_jobs "
            "WHERE id = ANY($1) ORDER BY id = $2 DESC", claimed, busy)
        return sorted(kept) == sorted(claimed), [row["until"] for row in rows]

    all_kept, (busy_until, free_until) = await db.run(scenario)
    assert all_kept  # the row being recorded is still held: not counted as lost
    assert free_until == pytest.approx(now + 100)
    assert busy_until == pytest.approx(now + LEASE_SECONDS)  # left to its holder
