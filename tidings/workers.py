"""``tidings serve --workers N``: N service processes sharing one port.

Each worker is a whole ``tidings serve`` process (its own HTTP server,
actors and connection pool) bound to the same address with ``SO_REUSEPORT``,
so the kernel spreads new connections across them. They share work through
PostgreSQL as separate processes always do. This process only starts them,
forwards SIGTERM/Ctrl-C to them once, and waits. With the embedded
PostgreSQL it starts the server first and hands its URL to the workers, so
they do not race to start it, and it stops the server after the last worker.
It also hands them the data dir's sealing key (``tidings.sealing``): a
worker given a database URL would otherwise make a key of its own, and the
replays of responses that carry a secret would fail on the other workers.

A worker that exits on its own (a crash, an out-of-memory kill) is replaced
by a new one while the others go on serving; its work is picked up from
PostgreSQL when its leases end. A worker that keeps exiting (more than
``RESTARTS`` within ``RESTART_WINDOW_SECONDS``: a database gone for good, a
setting it cannot use) stops the others too, and the command exits 1 for a
process manager to see.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import trio

from tidings.config import Config
from tidings.sealing import load_key
from tidings.storage.db import open_asyncio_bridge, resolve_url

log = logging.getLogger("tidings")

# A worker polls for this parent and stops when it is gone.
PARENT_ENV = "TIDINGS_WORKER_PARENT"
# What a worker gets after the signal beyond its grace for requests in
# flight: its actors' stop (tidings.cli.ACTOR_STOP_SECONDS) and a margin.
STOP_MARGIN_SECONDS = 6.5
SIGNALS = (signal.SIGINT, signal.SIGTERM)
# A worker that exits on its own is replaced, unless this many were already
# replaced within the window: then the set stops (exit status 1).
RESTARTS = 5
RESTART_WINDOW_SECONDS = 60.0


async def _database_url(config: Config) -> str:
    async with open_asyncio_bridge():
        return await resolve_url(config)


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


def _stop(workers: list[subprocess.Popen[bytes]], seconds: float) -> bool:
    """SIGTERM each worker once; kill what outlives ``seconds``. True if all
    stopped cleanly: exit status 0, or ended by that SIGTERM before they
    had set up their own handling (while starting, with nothing in flight)."""
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    clean = True
    deadline = time.monotonic() + seconds
    for worker in workers:
        try:
            code = worker.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("worker %d still running %.1f s after the signal: killing it",
                        worker.pid, seconds)
            worker.kill()
            code = worker.wait()
        clean = clean and code in (0, -signal.SIGTERM)
    return clean


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
    if not config.database_url:
        env["DATABASE_URL"] = trio.run(_database_url, config)
        # Read (or made) before the URL hides the data dir from the workers.
        env["TIDINGS_SECRET_KEY"] = load_key(config).hex()
    env[PARENT_ENV] = str(os.getpid())
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
    while True:
        if received:
            log.info("%s received: stopping %d workers", signal.Signals(received[0]).name,
                     count)
            return 0 if _stop(workers, stop_seconds) else 1
        for index, worker in enumerate(workers):
            if worker.poll() is None:
                continue
            now = time.monotonic()
            restarts = [at for at in restarts if now - at < RESTART_WINDOW_SECONDS]
            if len(restarts) >= RESTARTS:
                log.error("worker %d exited with %d, after %d restarts within %.0f s: "
                          "stopping the others", worker.pid, worker.returncode, len(restarts),
                          RESTART_WINDOW_SECONDS)
                _stop(workers, stop_seconds)
                return 1
            restarts.append(now)
            workers[index] = start()
            log.error("worker %d exited with %d: started worker %d in its place", worker.pid,
                      worker.returncode, workers[index].pid)
        time.sleep(0.2)  # a signal runs ``note``; the next turn sees it


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
