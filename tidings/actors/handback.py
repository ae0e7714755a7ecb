"""Handing leased rows (or any claim) back when storage is down.

An actor that stops with rows leased (it crashed, or a record failed)
hands them back at once, so that they are taken up again now rather than
when their leases end (up to a minute). When storage is down, as on a
database restart, that hand-back fails like everything else; the rows
would then wait out their leases although the process that holds them is
alive and storage answers again within seconds. So the hand-back is tried
again every ``RETRY_SECONDS`` while storage cannot be reached:

* until it succeeds;
* or until the leases are about to end by themselves (``until``): past
  that, a claim (this process's own, after a restart of the actor) may
  hold the rows again, and a late hand-back would take them from it;
* or until the actor is asked to stop (a shutdown), which it must not
  hold up: the leases end by themselves then.

It is shielded: the actor's own crash cancels its tasks, and that is when
rows are handed back. Other failures raise, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from tidings.storage.errors import outage

log = logging.getLogger("tidings.actors")

RETRY_SECONDS = 0.5
# The longest one attempt may take (a release that hangs is tried again).
ATTEMPT_SECONDS = 2.0


async def hand_back(
    release: Callable[[], Awaitable[None]], *, until: float, stopping: Callable[[], bool],
    shield: bool = True,
) -> bool:
    """Run ``release`` (see the module's docstring); whether it ran.
    ``shield=False``: a cancellation ends the attempt and the waits between
    them (a shutdown past its grace must not wait for storage that hangs)."""
    waited = False
    while True:
        with trio.move_on_after(ATTEMPT_SECONDS, shield=shield):
            try:
                await release()
            except Exception as error:
                if not outage(error):
                    raise
            else:
                if waited:
                    log.info("handed back once storage answered again")
                return True
        if stopping() or trio.current_time() + RETRY_SECONDS >= until:
            return False
        waited = True
        with trio.CancelScope(shield=shield):
            await trio.sleep(RETRY_SECONDS)
