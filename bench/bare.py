"""The bare comparison apps of ``python -m bench api``: quart-trio, nothing else,
and (``--asgi``) a plain ASGI function without Quart.

``POST /contacts`` reads and parses the JSON body and answers ``{}``; both are
served by ``tidings.app.serve_asgi``, so hypercorn runs with the same settings
(and the same connection wrapper) as Tidings. Run as
``python -m bench.bare --port N [--asgi]``; SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import json
import signal
from typing import Any

import trio
from quart import request
from quart_trio import QuartTrio

from tidings.app import serve_asgi

app = QuartTrio("bare")


@app.post("/contacts")
async def create_contact() -> tuple[dict[str, Any], int]:
    json.loads(await request.get_data())
    return {}, 201


@app.get("/healthz")
async def healthz() -> dict[str, Any]:
    return {}


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """What hypercorn itself costs: the body read and parsed, ``{}`` answered."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["method"] == "POST":
        json.loads(body)
    await send({"type": "http.response.start", "status": 201 if body else 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


async def main(host: str, port: int, asgi: bool) -> None:
    stop = trio.Event()

    async def watch_signals() -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                stop.set()
                return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_signals)
        await serve_asgi(asgi_app if asgi else app, host, port, shutdown_trigger=stop.wait)
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--asgi", action="store_true", help="a plain ASGI app, without Quart")
    args = parser.parse_args()
    trio.run(main, args.host, args.port, args.asgi)
