"""The embedded PostgreSQL (the ``pgserver`` package): started, shared, watched.

Every process that uses the same data dir joins one server, which stops when
the last of them exits. A process killed with ``kill -9`` never leaves
pgserver's list of users, so each process forgets the dead ones when it
starts and when it exits. A server that stops under the processes using it
(killed, out of memory) is started again by ``tidings.storage.db.watch_embedded``,
which each of them runs (for the workers of ``tidings serve --workers N``,
which reach it by its URL, their parent does: ``tidings.workers``): the
first to see it gone starts it, under pgserver's lock, and the pools
reconnect to the same socket.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import warnings
from pathlib import Path

log = logging.getLogger("tidings.storage")


class _LogNotShown(logging.Filter):
    """pgserver logs the whole of PostgreSQL's log, since the data dir was
    made, when a start fails: thousands of lines for one failed restart.
    Its record keeps the first line and says where the log is."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "Showing contents of postgres server log" in message:
            first, _, rest = message.partition("\n")
            where = rest.partition("(")[2].partition(")")[0]
            record.msg, record.args = "%s (PostgreSQL's log: %s)", (first, where or "?")
        return True


logging.getLogger("pgserver").addFilter(_LogNotShown())


def start_embedded(data_dir: Path) -> str:
    """Start (or join) the embedded PostgreSQL in ``data_dir``; return its admin URL.

    Blocking: run it in a thread. The server is shared by every process
    that uses the same data dir and stops when the last of them exits;
    processes that died unannounced are forgotten at each start and exit.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver

    data_dir.mkdir(parents=True, exist_ok=True)
    pgdata = pgdata_of(data_dir)
    forget_dead_users(pgdata)
    remove_stale_lock(pgdata)
    server = pgserver.get_server(pgdata, cleanup_mode="stop")
    if pgdata not in _pruned_at_exit:
        # atexit runs the last registered first: before pgserver's own exit,
        # which stops the server only when this process is the last one listed.
        _pruned_at_exit.add(pgdata)
        atexit.register(forget_dead_users, pgdata)
    return str(server.get_uri())


_pruned_at_exit: set[Path] = set()


# pgserver's list of the processes using a server: the last to leave stops it.
HANDLE_LIST = ".handle_pids.json"


def forget_dead_users(pgdata: Path) -> list[int]:
    """Drop processes that no longer exist from pgserver's list of users of
    the server in ``pgdata``; return their pids.

    A process killed with ``kill -9`` never takes itself off that list, and
    while it is named there no clean exit stops the server. Done under
    pgserver's own inter-process lock, as it does its own changes.
    """
    from pgserver.postgres_server import PostgresServer

    path = pgdata / HANDLE_LIST
    with PostgresServer._lock:
        try:
            pids = [int(pid) for pid in json.loads(path.read_text())]
        except (OSError, ValueError, TypeError):
            return []
        dead = [pid for pid in pids if not process_exists(pid)]
        if dead:
            path.write_text(json.dumps([pid for pid in pids if pid not in dead]))
            log.info("forgot users of the embedded PostgreSQL that have died: %s", dead)
        return dead


def process_exists(pid: int) -> bool:
    """Whether ``pid`` names a live process (a zombie is not one)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, as another user
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust kill()
    # The state follows the command name, which is in parentheses.
    return stat.rpartition(")")[2].split()[:1] != ["Z"]




def remove_stale_lock(pgdata: Path) -> bool:
    """Remove ``postmaster.pid`` when the process its pid now names is not
    the server that wrote it (a pid used again after a reboot, a container
    restart); whether it did.

    pgserver takes any live process with that pid for the server: it would
    connect to no server, fail, and on exit stop that process, whatever it
    is (another program, this very process). The server is the process
    started when the file says; PostgreSQL itself treats such a file as
    stale. Under pgserver's lock, as its own changes are."""
    import psutil
    from pgserver.postgres_server import PostgresServer
    from pgserver.utils import PostmasterInfo

    with PostgresServer._lock:
        try:
            info = PostmasterInfo.read_from_pgdata(pgdata)
            if info is None or info.process is None:
                return False
            started = info.process.create_time()
        except (OSError, ValueError, AssertionError, psutil.Error):
            return False  # unreadable or gone meanwhile: PostgreSQL decides
        if abs(started - info.start_time.timestamp()) <= LOCK_START_SLACK_SECONDS:
            return False
        (pgdata / "postmaster.pid").unlink(missing_ok=True)
    log.warning("removed the stale lock file of the embedded PostgreSQL in %s: its pid %d "
                "is another process now", pgdata, info.pid)
    return True


# How far apart the server's start in postmaster.pid (whole seconds) and its
# process's own start may be.
LOCK_START_SLACK_SECONDS = 2.0


def pgdata_of(data_dir: Path) -> Path:
    return data_dir.resolve() / "pg"


def keep_embedded_running(data_dir: Path) -> None:
    """``revive_embedded``, a start that fails logged (the caller's next
    turn tries again). Blocking: run it in a thread."""
    try:
        revive_embedded(data_dir)
    except Exception as error:
        # One line: the next turn tries again, and a server still recovering
        # from a crash may refuse a start or two.
        log.warning("the embedded PostgreSQL in %s could not be started again: %s; "
                    "trying again shortly (its log: %s)", data_dir, _reason(error),
                    pgdata_of(data_dir) / "log")


def _remove_locks_of(pid: int, pgdata: Path, socket_dir: Path | None) -> None:
    """The lock files a server that has exited left: its data dir's and its
    socket's (each names its pid on its first line)."""
    locks = [pgdata / "postmaster.pid"]
    if socket_dir is not None:
        locks += Path(socket_dir).glob(".s.PGSQL.*.lock")
    for lock in locks:
        try:
            if lock.read_text().split("\n", 1)[0].strip() == str(pid):
                lock.unlink()
        except OSError:
            pass


def _reap(pid: int) -> None:
    """Collect the exit of ``pid`` if it is a child of this process."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _reason(error: Exception) -> str:
    returncode = getattr(error, "returncode", None)
    if returncode is not None:
        return f"pg_ctl ended with status {returncode}"
    return f"{type(error).__name__}: {error}"[:300]


def revive_embedded(data_dir: Path) -> bool:
    """Start the embedded server in ``data_dir`` again if it has stopped;
    whether it had. Blocking: run it in a thread."""
    from pgserver.postgres_server import PostgresServer
    from pgserver.utils import PostmasterInfo

    pgdata = pgdata_of(data_dir)
    server = PostgresServer._instances.get(pgdata)
    if server is None:
        return False
    remove_stale_lock(pgdata)
    with PostgresServer._lock:
        info = PostmasterInfo.read_from_pgdata(pgdata)
        if info is not None and info.is_running():
            if process_exists(info.pid):
                return False
            # A zombie: the server has exited and the process that inherited
            # it has not reaped it yet (slowly, or never: in a container
            # whose first process is Tidings itself). pgserver and
            # PostgreSQL take its pid for a running server; it is not one.
            _reap(info.pid)
            _remove_locks_of(info.pid, pgdata, info.socket_dir)
        log.warning("the embedded PostgreSQL in %s has stopped: starting it again", pgdata)
        server.ensure_postgres_running()
        return True
