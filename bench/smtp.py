"""``python -m bench smtp``: DKIM-signed messages per second to an SMTP sink,
by SMTP client, and the sink's own ceiling.

The sink is aiosmtpd in its own process (``bench.smtp_sink``). Each client
sends ``--messages`` transactional emails (html and text given, one
recipient, DKIM-signed with a 2048-bit key) over ``--connections`` persistent
connections:

- ``provider``: the SMTP provider Tidings uses, driven from trio as the send
  worker drives it (``smtplib`` connections in a pool, one worker thread per
  send that builds, signs and sends).
- ``threads``: plain ``smtplib`` in one thread per connection, each building,
  signing and sending its share: the provider without trio or its pool.
- ``aiosmtplib``: aiosmtplib on the trio-asyncio bridge, MIME and DKIM in
  worker threads (only when aiosmtplib is installed).
- ``sink``: the sink's ceiling: ``--connections`` processes sending one
  prepared message over and over with smtplib, nothing else.
"""

from __future__ import annotations

import argparse
import multiprocessing
import smtplib
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import trio

from bench.harness import log
from tidings.config import SmtpUrl
from tidings.email.dkim import new_private_key
from tidings.providers.email import DkimKey, OutgoingEmail
from tidings.providers.smtp import SmtpProvider, render

HTML = "<h1>Thanks for your order</h1>" + "<p>Your order #1234 ships tomorrow.</p>" * 10
TEXT = "Thanks for your order\n\n" + "Your order #1234 ships tomorrow.\n\n" * 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--clients", default="sink,provider,threads,aiosmtplib")


def email(key: bytes, i: int) -> OutgoingEmail:
    return OutgoingEmail(
        message_id=uuid.uuid4(), team_id=uuid.UUID(int=0), sender="Shop <orders@shop.example>",
        return_paths={f"r{i}@example.org": "b@bounces.shop.example"},
        recipients=(f"r{i}@example.org",),
        to=(f"r{i}@example.org",), subject=f"Order {i}", html=HTML, text=TEXT,
        dkim=DkimKey("shop.example", "tidings1", key),
    )


def run_provider(port: int, messages: int, connections: int, key: bytes) -> None:
    async def main() -> None:
        url = SmtpUrl("127.0.0.1", port, False, "off")
        provider = SmtpProvider(url, "bench.example", connections=connections)
        queue = iter(range(messages))

        async def worker() -> None:
            for i in queue:
                result = await provider.send(email(key, i))
                assert result.outcomes and result.outcomes[0].type == "sent", result

        async with trio.open_nursery() as nursery:
            for _ in range(connections * 2):
                nursery.start_soon(worker)
        await provider.aclose()

    trio.run(main)


def run_threads(port: int, messages: int, connections: int, key: bytes) -> None:
    counter = iter(range(messages))
    lock = threading.Lock()

    def worker() -> None:
        with smtplib.SMTP("127.0.0.1", port) as client:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                outgoing = email(key, i)
                [recipient] = outgoing.recipients
                client.sendmail(outgoing.return_paths[recipient], [recipient], render(outgoing))

    threads = [threading.Thread(target=worker) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def run_aiosmtplib(port: int, messages: int, connections: int, key: bytes) -> None:
    import aiosmtplib
    import trio_asyncio

    async def main() -> None:
        async with trio_asyncio.open_loop():
            queue = iter(range(messages))

            async def worker() -> None:
                client = aiosmtplib.SMTP(hostname="127.0.0.1", port=port, start_tls=False)
                await trio_asyncio.aio_as_trio(client.connect)()
                for i in queue:
                    outgoing = email(key, i)
                    message = await trio.to_thread.run_sync(render, outgoing)
                    [recipient] = outgoing.recipients
                    await trio_asyncio.aio_as_trio(client.sendmail)(
                        outgoing.return_paths[recipient], [recipient], message
                    )
                await trio_asyncio.aio_as_trio(client.quit)()

            async with trio.open_nursery() as nursery:
                for _ in range(connections):
                    nursery.start_soon(worker)

    trio.run(main)


def _blast(port: int, count: int, message: bytes) -> None:
    with smtplib.SMTP("127.0.0.1", port) as client:
        for i in range(count):
            client.sendmail("b@bounces.shop.example", [f"r{i}@example.org"], message)


def run_sink(port: int, messages: int, connections: int, key: bytes) -> None:
    message = render(email(key, 0))
    share = messages // connections
    processes = [
        multiprocessing.Process(target=_blast, args=(port, share, message))
        for _ in range(connections)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join()


CLIENTS: dict[str, Callable[[int, int, int, bytes], None]] = {
    "sink": run_sink,
    "provider": run_provider,
    "threads": run_threads,
    "aiosmtplib": run_aiosmtplib,
}


def run(args: argparse.Namespace) -> dict[str, Any]:
    key = new_private_key()
    results: dict[str, Any] = {"messages": args.messages, "connections": args.connections}
    for name in args.clients.split(","):
        if name == "aiosmtplib":
            try:
                import aiosmtplib  # noqa: F401
            except ImportError:
                results[name] = "not installed"
                continue
        sink = subprocess.Popen(
            [sys.executable, "-m", "bench.smtp_sink"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True,
        )
        try:
            assert sink.stdout is not None and sink.stdin is not None
            port = int(sink.stdout.readline())
            started = time.perf_counter()
            cpu_started = time.process_time()
            CLIENTS[name](port, args.messages, args.connections, key)
            elapsed = time.perf_counter() - started
            cpu = time.process_time() - cpu_started
            sink.stdin.write("count\n")
            sink.stdin.flush()
            received = int(sink.stdout.readline())
        finally:
            sink.kill()
            sink.wait()
        rate = received / elapsed
        # The sink's ceiling runs in child processes: no CPU of this one to show.
        cpu_ms = None if name == "sink" else round(cpu * 1000 / max(received, 1), 3)
        log(f"{name}: {received} messages in {elapsed:.2f} s: {rate:.0f}/s, {cpu_ms} ms CPU each")
        results[name] = {"received": received, "seconds": round(elapsed, 2),
                         "per_second": round(rate), "cpu_ms_per_message": cpu_ms}
    return results
