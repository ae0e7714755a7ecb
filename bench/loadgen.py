"""A lean HTTP/1.1 keep-alive load generator on raw trio sockets.

``run_load()`` opens N connections and keeps exactly one request in flight on each
until the phase's time is up. Requests are ready-made bytes from a caller's factory;
responses are parsed only as far as needed to find their end (status line,
Content-Length or chunked body, Connection). Only 2xx responses count as accepted
and only their latencies are recorded; anything else is counted as an error by kind
(``http_409``, ``ConnectionResetError``, ``TooSlowError``...).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

RequestFactory = Callable[[], bytes]

_RECEIVE_SIZE = 65536
_SAMPLE_BYTES = 300


class ProtocolError(Exception):
    """The server's response could not be parsed or the connection ended early."""


@dataclass
class PhaseResult:
    """Counts and latencies of one load phase."""

    seconds: float = 0.0
    accepted: int = 0
    latencies: list[float] = field(default_factory=list)
    error_kinds: Counter[str] = field(default_factory=Counter)
    # The first response body (or exception text) seen for each kind of error.
    error_samples: dict[str, str] = field(default_factory=dict)

    @property
    def errors(self) -> int:
        return sum(self.error_kinds.values())

    @property
    def requests_per_s(self) -> float:
        return self.accepted / self.seconds if self.seconds > 0 else 0.0

    def record_error(self, kind: str, sample: str) -> None:
        self.error_kinds[kind] += 1
        self.error_samples.setdefault(kind, sample[:_SAMPLE_BYTES])

    def summary(self) -> dict[str, object]:
        ordered = sorted(self.latencies)
        return {
            "accepted": self.accepted,
            "errors": self.errors,
            "requests_per_s": round(self.requests_per_s, 1),
            "p50_ms": round(percentile(ordered, 50) * 1000, 2),
            "p99_ms": round(percentile(ordered, 99) * 1000, 2),
            "error_kinds": dict(self.error_kinds),
        }


def percentile(ordered: list[float], pct: float) -> float:
    """Nearest-rank percentile of an already sorted list (0.0 when empty)."""
    if not ordered:
        return 0.0
    rank = max(1, -(-len(ordered) * pct // 100))  # ceil(n * pct / 100)
    return ordered[int(rank) - 1]


class Connection:
    """One keep-alive connection with its receive buffer."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def exchange(self, request: bytes) -> tuple[int, bool, bytes]:
        """Send one request; return (status, keep_alive, body) of its response."""
        await self.stream.send_all(request)
        while True:
            status, keep_alive, body = await self._read_response()
            if status >= 200 or status == 101:
                return status, keep_alive, body
            # 1xx interim response: the real one follows.

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def _fill(self) -> bool:
        data = await self.stream.receive_some(_RECEIVE_SIZE)
        self.buffer += data
        return bool(data)

    async def _read_until(self, marker: bytes) -> bytes:
        while (end := self.buffer.find(marker)) < 0:
            if not await self._fill():
                raise ProtocolError("connection closed mid-response")
        data = bytes(self.buffer[:end])
        del self.buffer[: end + len(marker)]
        return data

    async def _read_exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            if not await self._fill():
                raise ProtocolError("connection closed mid-body")
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    async def _read_response(self) -> tuple[int, bool, bytes]:
        head = await self._read_until(b"\r\n\r\n")
        status_line, *header_lines = head.split(b"\r\n")
        version, _, rest = status_line.partition(b" ")
        if not version.startswith(b"HTTP/1.") or len(rest) < 3:
            raise ProtocolError(f"bad status line {status_line[:80]!r}")
        status = int(rest[:3])
        keep_alive = version == b"HTTP/1.1"
        length: int | None = None
        chunked = False
        for line in header_lines:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                token = value.strip().lower()
                keep_alive = token == b"keep-alive" or (keep_alive and token != b"close")
        if status < 200 or status in (204, 304):
            return status, keep_alive, b""
        if chunked:
            return status, keep_alive, await self._read_chunked()
        if length is not None:
            return status, keep_alive, await self._read_exactly(length)
        while await self._fill():  # body delimited by the end of the connection
            pass
        body = bytes(self.buffer)
        self.buffer.clear()
        return status, False, body

    async def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int((await self._read_until(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                while await self._read_until(b"\r\n"):  # trailers, up to an empty line
                    pass
                return b"".join(parts)
            parts.append(await self._read_exactly(size))
            await self._read_exactly(2)


_TRANSPORT_ERRORS = (
    OSError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    trio.TooSlowError,
    ProtocolError,
    ValueError,
)


async def _connect(host: str, port: int, result: PhaseResult) -> Connection | None:
    try:
        return Connection(await trio.open_tcp_stream(host, port))
    except OSError as exc:
        result.record_error(type(exc).__name__, str(exc))
        return None


async def _worker(
    host: str,
    port: int,
    conn: Connection | None,
    make_request: RequestFactory,
    deadline: float,
    request_timeout: float,
    result: PhaseResult,
    pause_after_503: float = 0.0,
) -> None:
    try:
        while time.perf_counter() < deadline:
            if conn is None:
                conn = await _connect(host, port, result)
                if conn is None:
                    await trio.sleep(0.05)  # do not spin on a refusing server
                    continue
            request = make_request()
            started = time.perf_counter()
            try:
                with trio.fail_after(request_timeout):
                    status, keep_alive, body = await conn.exchange(request)
            except _TRANSPORT_ERRORS as exc:
                result.record_error(type(exc).__name__, str(exc))
                await conn.aclose()
                conn = None
                continue
            if 200 <= status < 300:
                result.accepted += 1
                result.latencies.append(time.perf_counter() - started)
            else:
                result.record_error(f"http_{status}", body.decode(errors="replace"))
            if not keep_alive:
                await conn.aclose()
                conn = None
            if status == 503 and pause_after_503 > 0:
                await trio.sleep(pause_after_503)  # as Retry-After asks
    finally:
        if conn is not None:
            await conn.aclose()


async def run_load(
    host: str,
    port: int,
    make_request: RequestFactory,
    *,
    connections: int,
    seconds: float,
    request_timeout: float = 10.0,
    pause_after_503: float = 0.0,
) -> PhaseResult:
    """Keep one request in flight on each of ``connections`` for ``seconds``.

    Connections are opened before the clock starts. When time is up no new
    requests are sent; those in flight are awaited and counted, and the rate is
    taken over the whole elapsed time.
    """
    result = PhaseResult()
    conns: list[Connection | None] = [None] * connections

    async def open_one(index: int) -> None:
        conns[index] = await _connect(host, port, result)

    async with trio.open_nursery() as nursery:
        for index in range(connections):
            nursery.start_soon(open_one, index)

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for conn in conns:
            nursery.start_soon(
                _worker,
                host,
                port,
                conn,
                make_request,
                started + seconds,
                request_timeout,
                result,
                pause_after_503,
            )
    result.seconds = time.perf_counter() - started
    return result


# --- wrk, when it is installed ------------------------------------------------

WRK_SCRIPT = """
local made = 0
function setup(thread)
  made = made + 1
  thread:set("tid", made)
end
local counter = 0
local template = %(template)s
function request()
  counter = counter + 1
  local id = "%(run)s-" .. tid .. "-" .. counter
  local num = string.format("%%04d", counter %% 9000 + 100)
  local headers = {["Authorization"] = "Bearer %(token)s",
                   ["Content-Type"] = "application/json"}
  if %(idempotent)s then headers["Idempotency-Key"] = "bench-" .. id end
  local body = template:gsub("ID", id):gsub("NUM", num)
  return wrk.format("POST", "%(path)s", headers, body)
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %%d, "duration_us": %%d, "non2xx": %%d, "errors": %%d, ' ..
    '"p50_us": %%d, "p99_us": %%d}\\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""

# A new contact per request: ID becomes a unique id in each body.
CONTACT_BODY = '{"email": "ID@bench.example", "first_name": "B"}'


def wrk_available() -> bool:
    return shutil.which("wrk") is not None


def run_wrk(
    host: str, port: int, token: str, *, idempotent: bool, run: str, connections: int,
    seconds: float, threads: int = 1, path: str = "/contacts", body: str = CONTACT_BODY,
) -> dict[str, Any]:
    """Drive ``POST path`` with wrk, each request's ``body`` with ``ID`` made unique
    and ``NUM`` four digits (and a fresh key on each when ``idempotent``)."""
    script = WRK_SCRIPT % {
        "template": json.dumps(body), "run": run, "token": token,
        "idempotent": str(idempotent).lower(), "path": path,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as file:
        file.write(script)
        file.flush()
        done = subprocess.run(
            ["wrk", f"-t{threads}", f"-c{connections}", f"-d{max(1, round(seconds))}s",
             "--timeout", "10s", "-s", file.name, f"http://{host}:{port}"],
            capture_output=True, text=True, check=True,
        )
    line = next(row for row in done.stdout.splitlines() if row.startswith("WRKJSON "))
    figures = json.loads(line.removeprefix("WRKJSON "))
    duration = figures["duration_us"] / 1e6
    accepted = figures["requests"] - figures["non2xx"]
    return {
        "accepted": accepted,
        "errors": figures["non2xx"] + figures["errors"],
        "requests_per_s": round(accepted / duration, 1),
        "p50_ms": round(figures["p50_us"] / 1000, 2),
        "p99_ms": round(figures["p99_us"] / 1000, 2),
    }
