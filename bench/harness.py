"""Start, probe and stop a ``tidings serve`` subprocess for the benchmarks.

``running_service()`` makes a fresh temporary directory, starts
``python -m tidings serve`` on a free local port with ``TIDINGS_DATA_DIR`` pointing
into it (or passes ``DATABASE_URL`` through when that is set), waits for
``GET /healthz`` to answer 200 and yields a ``Service``. The service's output goes
to a log file whose tail is printed to stderr when something fails. On exit the
service is stopped (SIGTERM, then SIGKILL) and the directory removed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

TIDINGS = (sys.executable, "-m", "tidings")
CHECKOUT = Path(__file__).resolve().parents[1]
_STARTED = time.monotonic()


class HarnessError(RuntimeError):
    """The service could not be started, used or stopped as the benchmark needs."""


def log(message: str) -> None:
    """Write a progress line to stderr (stdout is reserved for the JSON result)."""
    print(f"[bench {time.monotonic() - _STARTED:6.1f}s] {message}", file=sys.stderr, flush=True)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class Shutdown:
    """How the service ended: its exit code and how long it took after SIGTERM."""

    exit_code: int
    seconds: float
    killed: bool


class Service:
    """A running ``tidings serve`` subprocess and the environment it was given."""

    def __init__(
        self, workdir: Path, env: dict[str, str], host: str, port: int,
        serve_args: Sequence[str] = (),
    ) -> None:
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.log_path = workdir / "service.log"
        self.env = env
        self.host = host
        self.port = port
        self.base_url = f"http://{host}:{port}"
        self.shutdown: Shutdown | None = None
        self._log_file = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [*TIDINGS, "serve", "--host", host, "--port", str(port), *serve_args],
            env=env,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C on the bench must not reach it directly
        )

    def wait_healthy(self, timeout: float = 60.0) -> None:
        """Poll ``GET /healthz`` until it answers 200."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise HarnessError(f"service exited with code {self.process.returncode}")
            try:
                if httpx.get(f"{self.base_url}/healthz", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise HarnessError(f"service not healthy after {timeout:.0f}s")
            time.sleep(0.2)

    def cli(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``tidings <args>`` with the service's environment; return its stdout."""
        try:
            done = subprocess.run(
                [*TIDINGS, *args],
                env=self.env,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise HarnessError(f"`tidings {' '.join(args)}` took over {timeout:.0f}s") from None
        if done.returncode != 0:
            raise HarnessError(
                f"`tidings {' '.join(args)}` exited {done.returncode}:\n{done.stderr.strip()}"
            )
        return done.stdout

    def create_token(self, team: str = "bench") -> str:
        """Create a team with an all-scopes token and return the secret token."""
        out = self.cli("tokens", "create", "--team", team, "--all")
        lines = [line for line in out.splitlines() if line.strip()]
        try:
            token = json.loads(lines[-1])["token"]
        except (IndexError, ValueError, KeyError, TypeError):
            raise HarnessError(f"unexpected `tokens create` output: {out!r}") from None
        if not isinstance(token, str):
            raise HarnessError(f"unexpected `tokens create` output: {out!r}")
        return token

    def peak_rss_mb(self) -> float:
        """The service process's peak resident set size (VmHWM), in MiB."""
        try:
            status = Path(f"/proc/{self.process.pid}/status").read_text()
        except OSError as exc:
            raise HarnessError(f"cannot read service memory: {exc}") from None
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
        raise HarnessError("no VmHWM in /proc status")

    def stop(self, timeout: float = 45.0) -> Shutdown:
        """SIGTERM the service and wait; SIGKILL it if it outlives ``timeout``."""
        if self.shutdown is not None:
            return self.shutdown
        started = time.monotonic()
        killed = False
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                log(f"service still running {timeout:.0f}s after SIGTERM; killing it")
                self.process.kill()
                self.process.wait()
                killed = True
        seconds = round(time.monotonic() - started, 3)
        self.shutdown = Shutdown(self.process.returncode, seconds, killed)
        self._log_file.close()
        self._stop_leftover_postgres()
        return self.shutdown

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _stop_leftover_postgres(self) -> None:
        """Stop an embedded PostgreSQL the service left running in our data dir."""
        if not self.data_dir.exists():
            return
        for pid_file in self.data_dir.rglob("postmaster.pid"):
            if _gone(pid_file, within=5.0):
                continue
            try:
                pid = int(pid_file.read_text().split()[0])
                is_postgres = "postgres" in Path(f"/proc/{pid}/comm").read_text()
            except (OSError, ValueError, IndexError):
                continue
            if is_postgres:
                log(f"service left PostgreSQL (pid {pid}) running; stopping it")
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
                _gone(pid_file, within=10.0)


def _gone(path: Path, within: float) -> bool:
    deadline = time.monotonic() + within
    while path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def service_env(data_dir: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment plus the service settings for a benchmark run."""
    env = dict(os.environ)
    if env.get("DATABASE_URL"):
        env.pop("TIDINGS_DATA_DIR", None)
    else:
        env["TIDINGS_DATA_DIR"] = str(data_dir)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    # The service runs in its work directory, so the code it imports is the
    # PYTHONPATH's (an A/B run puts another checkout first), then this one.
    path = [env.get("PYTHONPATH", ""), str(CHECKOUT)]
    env["PYTHONPATH"] = os.pathsep.join(part for part in path if part)
    return env


@contextmanager
def running_service(
    extra_env: Mapping[str, str] | None = None,
    host: str = "127.0.0.1",
    startup_timeout: float = 60.0,
    serve_args: Sequence[str] = (),
) -> Iterator[Service]:
    """A healthy service on a free port, stopped and cleaned up afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix="tidings-bench-"))
    service: Service | None = None
    try:
        (workdir / "data").mkdir()
        env = service_env(workdir / "data", extra_env or {})
        port = free_port(host)
        database = "DATABASE_URL" if "TIDINGS_DATA_DIR" not in env else env["TIDINGS_DATA_DIR"]
        log(f"starting service on {host}:{port} (database: {database})")
        started = time.monotonic()
        service = Service(workdir, env, host, port, serve_args)
        service.wait_healthy(startup_timeout)
        log(f"service healthy after {time.monotonic() - started:.1f}s")
        yield service
    except BaseException:
        if service is not None:
            service.stop(timeout=5.0)
            tail = service.log_tail()
            if tail:
                log(f"last lines of the service log:\n{tail}")
        raise
    finally:
        if service is not None:
            service.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def database_url(service: Service) -> str:
    url = service.env.get("DATABASE_URL")
    if url:
        return url
    import pgserver

    server = pgserver.get_server(service.data_dir / "pg", cleanup_mode=None)
    return str(server.get_uri("tidings"))


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def postgres_cpu(service: Service) -> dict[int, float]:
    """CPU seconds of the service's embedded PostgreSQL, by process (the
    postmaster and its children; empty with DATABASE_URL)."""
    pids = set()
    for pid_file in service.data_dir.rglob("postmaster.pid"):
        pids.add(int(pid_file.read_text().split()[0]))
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry.name) in pids or int(stat[1]) in pids:
            found[int(entry.name)] = process_cpu_seconds(int(entry.name))
    return found
