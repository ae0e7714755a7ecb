"""An SMTP sink for benchmarks: aiosmtpd in its own process, accepting and
counting every message. ``python -m bench.smtp_sink`` prints its port, then
serves until killed; each line read on stdin answers with the count so far."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from aiosmtpd.smtp import SMTP


class Counter:
    def __init__(self) -> None:
        self.messages = 0

    async def handle_EHLO(
        self, server: Any, session: Any, envelope: Any, hostname: str, responses: list[str]
    ) -> list[str]:
        # aiosmtpd serves pipelined commands in order; it just does not offer them.
        session.host_name = hostname
        return [*responses[:-1], "250-PIPELINING", responses[-1]]

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages += 1
        return "250 2.0.0 queued"


async def main() -> None:
    counter = Counter()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: SMTP(counter), "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while await reader.readline():
        print(counter.messages, flush=True)


if __name__ == "__main__":
    asyncio.run(main())
