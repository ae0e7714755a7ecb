"""``tidings.actors.handback``: leased rows handed back while storage is down,
on trio's autojump clock."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from tidings.actors.handback import ATTEMPT_SECONDS, RETRY_SECONDS, hand_back


class Release:
    """Fails ``down`` times as storage would when it cannot be reached, then works."""

    def __init__(self, down: int, error: Exception | None = None) -> None:
        self.down = down
        self.error = error or ConnectionRefusedError(111, "Connection refused")
        self.calls: list[float] = []

    async def __call__(self) -> None:
        self.calls.append(trio.current_time())
        if len(self.calls) <= self.down:
            raise self.error


async def test_a_hand_back_is_tried_again_until_storage_answers(autojump_clock: Any) -> None:
    release = Release(down=10)
    start = trio.current_time()
    assert await hand_back(release, until=start + 60, stopping=lambda: False)
    assert len(release.calls) == 11
    assert release.calls[-1] - start == pytest.approx(10 * RETRY_SECONDS)


async def test_a_hand_back_even_as_its_actor_is_cancelled(autojump_clock: Any) -> None:
    release = Release(down=4)
    with trio.CancelScope() as scope:
        scope.cancel()  # the actor's own crash cancels the task handing back
        handed = await hand_back(release, until=trio.current_time() + 60, stopping=lambda: False)
    assert handed and len(release.calls) == 5


async def test_a_hand_back_stops_before_the_leases_end(autojump_clock: Any) -> None:
    release = Release(down=1000)
    start = trio.current_time()
    assert not await hand_back(release, until=start + 5, stopping=lambda: False)
    # Never at or after ``until``: the rows may be another claim's by then.
    assert max(release.calls) < start + 5
    assert len(release.calls) == 10


async def test_a_hand_back_tries_once_when_its_actor_is_stopping(autojump_clock: Any) -> None:
    release = Release(down=1000)
    assert not await hand_back(release, until=trio.current_time() + 60, stopping=lambda: True)
    assert len(release.calls) == 1


async def test_a_hand_back_that_fails_otherwise_raises(autojump_clock: Any) -> None:
    release = Release(down=1, error=RuntimeError("a bug"))
    with pytest.raises(RuntimeError):
        await hand_back(release, until=trio.current_time() + 60, stopping=lambda: False)
    assert len(release.calls) == 1


async def test_an_unshielded_hand_back_does_not_wait_for_storage_that_hangs_past_a_cancel(
    autojump_clock: Any,
) -> None:
    """A shutdown past its grace: a shielded attempt waits its full
    ATTEMPT_SECONDS on storage that hangs; an unshielded one ends at once."""
    async def hangs() -> None:
        await trio.sleep_forever()

    for shield, waited in ((True, ATTEMPT_SECONDS), (False, 0.0)):
        start = trio.current_time()
        with trio.CancelScope() as scope:
            scope.cancel()
            await hand_back(hangs, until=start + 60, stopping=lambda: True, shield=shield)
        assert trio.current_time() - start == pytest.approx(waited)
