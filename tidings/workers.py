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

If a worker exits on its own, the others are stopped too and the command
exits 1: a process manager then restarts the whole set.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

import trio

from tidings.config import Config
from tidings.sealing import load_key
from tidings.storage.db import open_asyncio_bridge, resolve_url

log = logging.getLogger("tidings")

# A worker polls for this parent and stops when it is gone.
PARENT_ENV = "TIDINGS_WORKER_PARENT"
# Workers drain within 9.5 s of the signal (tidings.cli); then they are killed.
STOP_SECONDS = 10.5


async def _database_url(config: Config) -> str:
    async with open_asyncio_bridge():
        return await resolve_url(config)


def _stop(workers: list[subprocess.Popen[bytes]]) -> bool:
    """SIGTERM each worker once; kill what outlives STOP_SECONDS. True if all exited 0."""
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    clean = True
    for worker in workers:
        try:
            code = worker.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            log.warning("worker %d still running after %.1f s: killing it", worker.pid,
                        STOP_SECONDS)
            worker.kill()
            code = worker.wait()
        clean = clean and code == 0
    return clean


def run_workers(config: Config, host: str, port: int, count: int) -> int:
    """Run ``count`` workers until a signal (exit status 0) or a worker's own exit (1)."""
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
    # Own sessions: a Ctrl-C at the terminal reaches this process only, which
    # forwards it once (a second one would make a worker stop at once).
    workers = [
        subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        for _ in range(count)
    ]
    # Blocked only now: the workers must not inherit the blocked mask.
    signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    log.info("started %d workers: %s", count, ", ".join(str(w.pid) for w in workers))
    while True:
        received = signal.sigtimedwait(signals, 0.5)
        if received is not None:
            log.info("%s received: stopping %d workers", signal.Signals(received.si_signo).name,
                     count)
            return 0 if _stop(workers) else 1
        ended = [worker for worker in workers if worker.poll() is not None]
        if ended:
            log.error("worker %d exited with %d: stopping the others", ended[0].pid,
                      ended[0].returncode)
            _stop(workers)
            return 1


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
