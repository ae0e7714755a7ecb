"""``tidings serve --workers N``: N service processes sharing one port.

Each worker is a whole ``tidings serve`` process (its own HTTP server,
actors and connection pool) bound to the same address with ``SO_REUSEPORT``,
so the kernel spreads new connections across them. They share work through
PostgreSQL as separate processes always do. This process only starts them,
forwards SIGTERM/Ctrl-C to them (a second one too: they stop at once), and
waits. With the embedded
PostgreSQL it starts the server first and hands its URL to the workers, so
they do not race to start it, and it stops the server after the last worker.
It also hands them one sealing key (``tidings.sealing``, through
``HANDED_KEY_ENV``): ``TIDINGS_SECRET_KEY``, else the data dir's key file
with the embedded PostgreSQL, else one it makes; a worker would otherwise
make a key of its own, and the replays of responses that carry a secret
would fail on the other workers.

Before any worker starts (and before a single ``tidings serve`` opens its
pools) the server's connection limit is checked against what the processes
may open at most (``tidings.connection_limits``).

A worker that exits on its own (a crash, an out-of-memory kill) is replaced
by a new one while the others go on serving; its work is picked up from
PostgreSQL when its leases end. While the database does not answer, the
replacement waits for it (a new worker could not start, and the others
answer 503 meanwhile). A worker that keeps exiting with the database up
(more than ``RESTARTS`` within ``RESTART_WINDOW_SECONDS``: a setting it
cannot use) stops the others too, and the command exits 1 for a process
manager to see.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import trio
import triopg

from tidings import MULTIPROC_ENV, PARENT_ENV
from tidings.config import Config
from tidings.connection_limits import check_connections
from tidings.sealing import HANDED_KEY_ENV, load_key
from tidings.storage.db import WATCH_SECONDS, open_asyncio_bridge, resolve_url
from tidings.storage.embedded import keep_embedded_running

log = logging.getLogger("tidings")

# What a worker gets after the signal beyond its grace for requests in
# flight: its actors' stop (tidings.cli.ACTOR_STOP_SECONDS) and a margin.
STOP_MARGIN_SECONDS = 6.5
SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Signals to a worker this close together are one stop (``stop_signals``).
SAME_STOP_SECONDS = 1.0
# A worker that exits on its own is replaced, unless this many were already
# replaced within the window: then the set stops (exit status 1).
RESTARTS = 5
RESTART_WINDOW_SECONDS = 60.0
MAX_WORKERS = 64
# The directory a set's workers keep their shared metrics in, then the parent's pid.
METRICS_DIR_PREFIX = "tidings-metrics-"
async def resolve_checked_url(config: Config, count: int) -> str:
    """The database's URL (starting the embedded server if it is the one),
    once :func:`check_connections` has let ``count`` processes use it."""
    async with open_asyncio_bridge():
        url = await resolve_url(config)
        await check_connections(url, config, count)
        return url


def refuse_taken_port(host: str, port: int) -> None:
    """OSError (EADDRINUSE) when something listens on ``host:port`` already.

    The workers bind with ``SO_REUSEPORT``, which would let them join the
    sockets of another set of workers on the same port and split its
    traffic between two services; a plain bind first finds the port taken
    (``SO_REUSEADDR``: connections of an earlier run in TIME-WAIT do not
    count, as for a single process).
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(address)


@contextmanager
def port_lock(host: str, port: int) -> Iterator[None]:
    """Held while a set of workers runs on ``host:port``: a second set started
    at the same moment, before either has bound, finds it taken (OSError
    EADDRINUSE) instead of sharing the port. The lock file is removed when
    the set stops."""
    path = Path(tempfile.gettempdir()) / f"tidings-workers-{host}-{port}.lock"
    while True:
        lock = path.open("a")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise OSError(errno.EADDRINUSE, "Address already in use") from None
        try:
            if os.stat(path).st_ino == os.fstat(lock.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        # The set that held it stopped and removed the file after this one
        # opened it: a lock on the removed file guards nothing, take the new one.
        lock.close()
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        lock.close()


def _signal(workers: list[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)


def _stop(workers: list[subprocess.Popen[bytes]], seconds: float, received: list[int]) -> bool:
    """SIGTERM each worker; kill what outlives ``seconds``. A signal to this
    process after the one that stops the set (``received`` grows) is sent on
    too, once at least ``SAME_STOP_SECONDS`` after the first: the workers
    then stop at once, as a single process does on a second signal. True if
    all stopped cleanly: exit status 0, or ended by that SIGTERM before they
    had set up their own handling (while starting, with nothing in flight)."""
    _signal(workers)
    signalled, seen = time.monotonic(), len(received)
    deadline = signalled + seconds
    while any(worker.poll() is None for worker in workers):
        now = time.monotonic()
        if len(received) > seen and now - signalled >= SAME_STOP_SECONDS:
            log.warning("second signal: stopping the workers now")
            _signal(workers)
            signalled, seen = now, len(received)
        if now >= deadline:
            for worker in workers:
                if worker.poll() is None:
                    log.warning("worker %d still running %.1f s after the signal: killing it",
                                worker.pid, seconds)
                    worker.kill()
                    worker.wait()
        time.sleep(0.05)  # a signal runs ``note``; the next turn sees it
    return all(worker.returncode in (0, -signal.SIGTERM) for worker in workers)


async def stop_signals(signals: AsyncIterator[int]) -> AsyncIterator[int]:
    """The signals that stop this process: in a worker, one that comes within
    ``SAME_STOP_SECONDS`` of the first is the same stop, not a second one. A
    stop of the whole group (systemd's default ``KillMode``, a container's
    stop) signals each worker and the parent at once, and the parent sends
    its own on: two signals that mean one graceful stop."""
    first: float | None = None
    async for signum in signals:
        now = trio.current_time()
        if first is not None and now - first < SAME_STOP_SECONDS and os.environ.get(PARENT_ENV):
            log.info("%s again within %g s: the same stop", signal.Signals(signum).name,
                     SAME_STOP_SECONDS)
            continue
        first = now if first is None else first
        yield signum


def run_workers(config: Config, host: str, port: int, count: int) -> int:
    """Run ``count`` workers until a signal (exit status 0) or a worker's own exit (1)."""
    received: list[int] = []

    def note(signum: int, frame: object) -> None:
        received.append(signum)

    # From the start, so that a signal while the workers start still stops
    # them cleanly. exec() resets a handled signal, so workers keep their own.
    previous = {each: signal.signal(each, note) for each in SIGNALS}
    try:
        return _supervise(config, host, port, count, received)
    finally:
        for each, handler in previous.items():
            signal.signal(each, handler)


def _supervise(config: Config, host: str, port: int, count: int, received: list[int]) -> int:
    if port == 0:
        raise SystemExit("tidings: --workers needs a fixed --port (0 would give each its own)")
    with port_lock(host, port):
        refuse_taken_port(host, port)
        return _run(config, host, port, count, received)


def _run(config: Config, host: str, port: int, count: int, received: list[int]) -> int:
    env = dict(os.environ)
    # Read (or made) before the URL hides the data dir from the workers. Not
    # as TIDINGS_SECRET_KEY, which would also change the unsubscribe and
    # bounce keys that processes without it keep in the database.
    env[HANDED_KEY_ENV] = load_key(config).hex()
    url = trio.run(resolve_checked_url, config, count)
    if not config.database_url:
        env["DATABASE_URL"] = url
    env[PARENT_ENV] = str(os.getpid())
    # The workers' HTTP series, in files they share (``tidings.metrics``).
    remove_orphan_metric_dirs()
    shared_metrics = tempfile.mkdtemp(prefix=f"{METRICS_DIR_PREFIX}{os.getpid()}-")
    env[MULTIPROC_ENV] = shared_metrics
    try:
        return _serve(env, url, config, host, port, count, received)
    finally:
        shutil.rmtree(shared_metrics, ignore_errors=True)


def remove_orphan_metric_dirs() -> None:
    """Remove the metric directories of sets whose parent is gone (a parent
    killed with SIGKILL cannot remove its own); those of live sets stay."""
    for path in Path(tempfile.gettempdir()).glob(f"{METRICS_DIR_PREFIX}*-*"):
        pid = path.name.removeprefix(METRICS_DIR_PREFIX).split("-", 1)[0]
        try:
            if not pid.isdigit() or path.lstat().st_uid != os.getuid() or not path.is_dir():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:  # gone meanwhile, or a live process of another user
            continue


def _serve(
    env: dict[str, str], url: str, config: Config, host: str, port: int, count: int,
    received: list[int],
) -> int:
    command = [
        sys.executable, "-m", "tidings", "serve", "--host", host, "--port", str(port),
        "--reuse-port",
    ]

    def start() -> subprocess.Popen[bytes]:
        # Own sessions: a Ctrl-C at the terminal reaches this process only,
        # which forwards it once (a second one would make a worker stop at once).
        return subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                start_new_session=True)

    workers = [start() for _ in range(count)]
    stop_seconds = config.shutdown_grace_seconds + STOP_MARGIN_SECONDS
    log.info("started %d workers: %s", count, ", ".join(str(w.pid) for w in workers))
    restarts: list[float] = []
    waiting: set[int] = set()  # exited workers whose replacement waits for the database
    database = DatabaseCheck(url)
    watched = time.monotonic()
    while True:
        if config.database_url is None and time.monotonic() - watched >= WATCH_SECONDS:
            # The workers reach the embedded server by its URL and do not
            # watch it (``watch_embedded``): the parent does.
            watched = time.monotonic()
            keep_embedded_running(config.data_dir)
        if received:
            log.info("%s received: stopping %d workers", signal.Signals(received[0]).name,
                     count)
            return 0 if _stop(workers, stop_seconds, received) else 1
        for index, worker in enumerate(workers):
            if worker.poll() is None:
                continue
            if not database.answers():
                if worker.pid not in waiting:
                    waiting.add(worker.pid)
                    log.warning("worker %d exited with %d; the database does not answer: its "
                                "replacement starts once it does", worker.pid, worker.returncode)
                continue
            now = time.monotonic()
            restarts = [at for at in restarts if now - at < RESTART_WINDOW_SECONDS]
            if len(restarts) >= RESTARTS:
                log.error("worker %d exited with %d, after %d restarts within %.0f s: "
                          "stopping the others", worker.pid, worker.returncode, len(restarts),
                          RESTART_WINDOW_SECONDS)
                _stop(workers, stop_seconds, received)
                return 1
            restarts.append(now)
            workers[index] = start()
            log.error("worker %d exited with %d: started worker %d in its place", worker.pid,
                      worker.returncode, workers[index].pid)
        time.sleep(0.2)  # a signal runs ``note``; the next turn sees it


class DatabaseCheck:
    """Whether the database answers, asked at most once a second whatever the
    number of workers waiting for it, so that a server that hangs delays the
    parent's turn (its signals, its watch) by a second at most."""

    EVERY_SECONDS = 1.0

    def __init__(self, url: str) -> None:
        self._url = url
        self._at = float("-inf")
        self._answer = False

    def answers(self) -> bool:
        if time.monotonic() - self._at >= self.EVERY_SECONDS:
            self._answer = trio.run(database_answers, self._url, self.EVERY_SECONDS)
            self._at = time.monotonic()
        return self._answer


async def database_answers(url: str, within: float) -> bool:
    """Whether the database at ``url`` answers a query within ``within`` seconds."""
    with trio.move_on_after(within):
        try:
            async with open_asyncio_bridge(), triopg.connect(url) as conn:
                return bool(await conn.fetchval("SELECT true"))
        except Exception:
            return False
    return False


async def watch_parent(stop: trio.Event) -> None:
    """In a worker: set ``stop`` when the ``tidings serve --workers`` parent is gone."""
    parent = os.environ.get(PARENT_ENV)
    if not parent:
        return
    # Nothing signals a parent's death to a child in its own session: poll.
    while True:
        await trio.sleep(1)
        if os.getppid() != int(parent):
            break
    log.warning("the parent process is gone: stopping")
    stop.set()
