"""Logging of the ``tidings`` command: text or one JSON object per line, the
request id on every record logged while a request is handled, and the
access log (logger ``tidings.access``)."""

from __future__ import annotations

import json
import logging
import re
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from tidings.ids import new_id
from tidings.storage.errors import outage

ACCESS = logging.getLogger("tidings.access")

# The id of the request being handled by the current task, if any.
request_id: ContextVar[str | None] = ContextVar("tidings_request_id", default=None)

# What an X-Request-Id sent by a client may be; anything else is replaced.
_ACCEPTED_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# Fields of the access log, in the order the text format shows them.
ACCESS_FIELDS = ("method", "route", "status", "duration_ms", "team_id", "request_id")
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def choose_request_id(sent: str | None) -> str:
    """The client's X-Request-Id when it is sane (1-128 of ``A-Za-z0-9._:-``), else a new one."""
    if sent is not None and _ACCEPTED_ID.fullmatch(sent):
        return sent
    return new_id().hex


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = request_id.get()
        return True


class _OutageInOneLine(logging.Filter):
    """asyncpg's pool retries its connections while the database is away and
    logs each failure with its traceback (20 lines, at 1, 2, 4... s): an
    error that is storage unavailable is logged in one line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and outage(error):
            record.msg = f"{record.getMessage()} ({type(error).__name__}: {error})"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the record's extras."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ).replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD and value is not None:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message``, and ``request_id=...`` when there is one."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        rid = getattr(record, "request_id", None)
        if rid is not None and record.name != ACCESS.name:
            line += f" request_id={rid}"
        return line


def configure_logging(level: str, log_format: str = "text") -> None:
    """Send every log record to stderr, in ``log_format`` (``text`` or ``json``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(_RequestIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    pool = logging.getLogger("asyncpg.pool")
    if not any(isinstance(f, _OutageInOneLine) for f in pool.filters):
        pool.addFilter(_OutageInOneLine())
    # The embedded server narrates every start at INFO.
    logging.getLogger("pgserver").setLevel(max(logging.WARNING, logging.getLevelName(level)))


def log_access(
    method: str, route: str, status: int, seconds: float, team_id: object, rid: str
) -> None:
    """One access log line: ``GET /contacts/{contact_id} 200 3.1ms team=... request_id=...``."""
    duration_ms = round(seconds * 1000, 1)
    ACCESS.info(
        "%s %s %s %.1fms team=%s request_id=%s",
        method, route, status, duration_ms, team_id or "-", rid,
        extra={
            "method": method, "route": route, "status": status, "duration_ms": duration_ms,
            "team_id": None if team_id is None else str(team_id), "request_id": rid,
        },
    )
