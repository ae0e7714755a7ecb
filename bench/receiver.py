"""A lean webhook receiver for the benchmarks: ``python -m bench.receiver``.

One process listens on several ports and answers every request at once: 200
(``ok``), 500 (``fail``), or nothing for a long time (``hang``), per port. It
notes the arrival time of each request (``<port> <event id> <unix time>``)
and writes the notes to ``--out`` when it gets SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

import trio

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
FAIL = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n"
ID_FIELD = b'"id":"'


class Notes:
    def __init__(self) -> None:
        self.lines: list[str] = []


async def connection(stream: trio.SocketStream, port: int, mode: str, notes: Notes) -> None:
    buffer = b""
    try:
        while True:
            while b"\r\n\r\n" not in buffer:
                data = await stream.receive_some(65536)
                if not data:
                    return
                buffer += data
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            while len(buffer) < length:
                data = await stream.receive_some(65536)
                if not data:
                    return
                buffer += data
            body, buffer = buffer[:length], buffer[length:]
            at = time.time()
            start = body.find(ID_FIELD) + len(ID_FIELD)
            notes.lines.append(f"{port} {body[start:start + 36].decode()} {at:.6f}")
            if mode == "hang":
                await trio.sleep(3600)
            await stream.send_all(OK if mode == "ok" else FAIL)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return


async def serve(ports: list[tuple[int, str]], out: Path) -> None:
    notes = Notes()
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            for port, mode in ports:
                listeners = await trio.open_tcp_listeners(port, host="127.0.0.1", backlog=1024)

                async def handler(
                    stream: trio.SocketStream, port: int = port, mode: str = mode
                ) -> None:
                    await connection(stream, port, mode, notes)

                nursery.start_soon(trio.serve_listeners, handler, listeners)
            print("ready", flush=True)
            async for _ in signals:
                break
            nursery.cancel_scope.cancel()
    await trio.Path(out).write_text("\n".join(notes.lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.receiver")
    parser.add_argument("--port", action="append", default=[], help="PORT:MODE (ok, fail, hang)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    ports = []
    for spec in args.port:
        port, _, mode = spec.partition(":")
        if mode not in ("ok", "fail", "hang"):
            sys.exit(f"unknown mode in {spec!r}")
        ports.append((int(port), mode))
    trio.run(serve, ports, args.out)


if __name__ == "__main__":
    main()
