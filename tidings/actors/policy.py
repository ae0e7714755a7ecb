"""Restart policies: how a supervised child is restarted, and when it is given up.

A child that crashes (an ``Exception`` escapes it) is restarted after a
capped exponential backoff with jitter. A crash because storage could not be
reached (``tidings.storage.errors.outage``) is no fault of the child's: it is
retried at least every ``Backoff.outage_retry`` seconds, so that every child
resumes within about that long once the database answers again (a restart,
a failover), and it never counts towards giving the child up. With an :class:`Intensity` a child
that crashes more than ``restarts`` times within ``within`` seconds is given
up instead: it is not restarted, and its supervisor calls its ``on_give_up``
hook, which decides what giving up means for its entity (a broadcast whose
actor keeps crashing on its data becomes ``failed``). Without one, the child
is restarted for as long as the process runs.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from dataclasses import dataclass

from tidings.storage.errors import outage

log = logging.getLogger("tidings.actors")


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with jitter between restarts."""

    initial: float = 0.1
    factor: float = 2.0
    maximum: float = 30.0
    jitter: float = 0.1
    # A run that lasted this long counts as healthy: the next crash starts over.
    reset_after: float = 60.0
    # The longest wait between restarts while storage cannot be reached.
    outage_retry: float = 1.0

    def delay(self, failures: int) -> float:
        try:
            base = min(self.maximum, self.initial * self.factor**failures)
        except OverflowError:  # a long crash loop: factor**failures left the floats
            base = self.maximum
        return base * random.uniform(1 - self.jitter, 1 + self.jitter)


# Restart after 0.1 s, doubling to 30 s; a run of 60 s without a crash starts over.
DEFAULT_BACKOFF = Backoff()
# A run this long between two crashes on a storage outage means storage
# answered in between: two outages, not one.
OUTAGE_APART = 5.0


@dataclass(frozen=True)
class Intensity:
    """At most ``restarts`` restarts within ``within`` seconds.

    The crash that would need one more restart inside that window gives the
    child up.
    """

    restarts: int
    within: float

    def __post_init__(self) -> None:
        if self.restarts < 0 or self.within <= 0:
            raise ValueError("an intensity needs restarts >= 0 and within > 0")


class Restarts:
    """The crash record of one child: its next backoff, and whether to give up."""

    __slots__ = ("_backoff", "_intensity", "_failures", "_crashes", "_outages")

    def __init__(self, backoff: Backoff, intensity: Intensity | None) -> None:
        self._backoff = backoff
        self._intensity = intensity
        self._failures = 0
        self._crashes: deque[float] = deque()
        self._outages = 0  # crashes in a row on a storage outage

    def crashed(self, started: float, now: float, crash: BaseException) -> float | None:
        """Note ``crash``, of the run that began at ``started``.

        Returns the delay before the restart, or None: give the child up.
        """
        ran = now - started
        if ran >= self._backoff.reset_after:
            self._failures = 0
        if outage(crash):
            # A run that got going first: storage answered in between, and
            # this is a new outage (logged as such).
            if ran >= OUTAGE_APART:
                self._outages = 0
            self._outages += 1
            return min(self._backoff.delay(self._outages - 1), self._backoff.outage_retry)
        self._outages = 0
        delay = self._backoff.delay(self._failures)
        self._failures += 1
        if self._intensity is not None:
            self._crashes.append(now)
            while self._crashes and self._crashes[0] <= now - self._intensity.within:
                self._crashes.popleft()
            if len(self._crashes) > self._intensity.restarts:
                return None
        return delay

    def log(self, child: str, crash: Exception, delay: float) -> None:
        """Log the crash that ``crashed`` just noted: with its traceback, but
        an outage in one line, once until the child runs again."""
        if self._outages == 0:
            log.error("%s crashed; restarting in %.2fs", child, delay, exc_info=crash)
        elif self._outages == 1:
            log.warning("%s: storage is unavailable (%s); restarting every %.2gs until it "
                        "answers", child, _first_error(crash), self._backoff.outage_retry)
        else:
            log.debug("%s: storage is still unavailable; restarting in %.2fs", child, delay)


def _first_error(crash: BaseException) -> BaseException:
    while isinstance(crash, BaseExceptionGroup):
        crash = crash.exceptions[0]
    return crash


def stopping_part(raised: BaseExceptionGroup[BaseException], child: str) -> BaseException:
    """What a child stopped while it failed raises on: the stop, its failure logged.

    A child with tasks of its own can fail as a shutdown cancels it (a
    database call cut short raises the driver's error, not the
    cancellation), and what escapes is a group of both. That failure is not
    a crash to restart, and raised on it would end the runtime's shutdown
    with a traceback: it is logged, and the cancellation goes on.
    """
    failure, stop = raised.split(Exception)
    if failure is not None:
        log.warning("%s failed as it was stopped", child, exc_info=failure)
    assert stop is not None  # a group of Exceptions alone is an ExceptionGroup
    return stop
