"""``python -m bench.email_sink PORT FILE``: an SMTP sink (aiosmtpd) in its own process.

Accepts every message (offering PIPELINING) and appends one line per message to FILE: the
arrival time (Unix seconds) and the message's Message-ID. The email
benchmark reads FILE to count arrivals and match them to its sends.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import time
from typing import Any

from aiosmtpd.controller import Controller

_MESSAGE_ID = re.compile(rb"^Message-ID:\s*(<[^>\r\n]+>)", re.IGNORECASE | re.MULTILINE)


class Recorder:
    def __init__(self, path: str) -> None:
        self._out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life

    async def handle_EHLO(
        self, server: Any, session: Any, envelope: Any, hostname: str, responses: list[str]
    ) -> list[str]:
        # aiosmtpd reads commands one after another from its buffer, so it
        # serves pipelined commands correctly; it just does not say so.
        session.host_name = hostname
        return [*responses[:-1], "250-PIPELINING", responses[-1]]

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        found = _MESSAGE_ID.search(envelope.original_content or b"")
        message_id = found.group(1).decode() if found else "-"
        self._out.write(f"{time.time():.6f} {message_id}\n")
        return "250 2.0.0 queued"


def main() -> None:
    port, path = int(sys.argv[1]), sys.argv[2]
    loop = asyncio.new_event_loop()
    controller = Controller(Recorder(path), hostname="127.0.0.1", port=port, loop=loop)
    controller.start()
    print("ready", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    controller.stop()


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    main()
