"""``tidings contacts import``: send a file of contacts to ``POST /contacts/import``.

The command is a client of the HTTP API, so a file goes through exactly the
checks an HTTP import does. A file longer than one request may carry is
sent in several requests of ``batch_size`` rows, and their reports are
added up, with rejected row numbers counted from the start of the file.
A CSV file is read as the service reads a body (``csv_records``), so one
whose quoting is broken is refused before anything is sent.
"""

from __future__ import annotations

import csv
import io
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO
from uuid import UUID

import httpx

from tidings.fields import strict_json
from tidings.http.contact_import import MAX_LISTED_REJECTIONS, MAX_ROWS
from tidings.http.import_rows import MalformedCsv, csv_records

__all__ = ["MAX_ROWS", "ImportFailed", "import_file"]

# A request of 50,000 rows takes a few seconds; a slow server gets much longer.
REQUEST_TIMEOUT_SECONDS = 600.0


class ImportFailed(Exception):
    """The file could not be read, or the service refused a request."""


class Progress:
    """Progress of an import on a text stream (stderr): rows sent, rows imported, rows/s.

    While a request is out it repeats, every ``every`` seconds, how long it has waited.
    """

    def __init__(self, stream: TextIO, every: float = 2.0) -> None:
        self._stream = stream
        self._every = every
        self._total = 0
        self._started = time.monotonic()
        self._waiting: threading.Event | None = None

    def _say(self, line: str) -> None:
        print(f"tidings: {line}", file=self._stream, flush=True)

    def begin(self, total: int) -> None:
        self._total = total
        self._started = time.monotonic()
        self._say(f"importing {total:,} rows")

    def sent(self, first: int, last: int) -> None:
        """Rows ``first`` to ``last`` (1-based) are on their way."""
        self._say(f"sent rows {first:,} to {last:,} of {self._total:,}; the service is on them")
        waiting = self._waiting = threading.Event()
        since = time.monotonic()

        def remind() -> None:
            while not waiting.wait(self._every):
                self._say(
                    f"rows {first:,} to {last:,}: waiting for the service "
                    f"({time.monotonic() - since:.0f}s)"
                )

        threading.Thread(target=remind, daemon=True).start()

    def imported(self, rows_done: int) -> None:
        if self._waiting is not None:
            self._waiting.set()
        elapsed = max(time.monotonic() - self._started, 1e-6)
        self._say(
            f"{rows_done:,} of {self._total:,} rows imported "
            f"({rows_done / elapsed:,.0f} rows/s, {elapsed:.1f}s)"
        )

    def stopped(self) -> None:
        if self._waiting is not None:
            self._waiting.set()


def _csv_batches(data: bytes, batch_size: int) -> tuple[int, Iterator[tuple[int, bytes]]]:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ImportFailed(f"the file is not UTF-8 (byte {error.start})") from None
    try:
        # As the service reads it: a file it would refuse stops here, before
        # any batch is sent.
        records = csv_records(text)
    except MalformedCsv as error:
        raise ImportFailed(f"the file is not valid CSV: {error}; nothing was imported") from None
    if not records:
        raise ImportFailed("the file is empty: it needs a header row")
    header, rows = records[0], records[1:]

    def batches() -> Iterator[tuple[int, bytes]]:
        if len(rows) <= batch_size:
            yield 0, data  # as it is: the service reads it the same way
            return
        for start in range(0, len(rows), batch_size):
            out = io.StringIO()
            writer = csv.writer(out, lineterminator="\n")
            writer.writerow(header)
            writer.writerows(rows[start : start + batch_size])
            yield start, out.getvalue().encode()

    return len(rows), batches()


def _json_batches(data: bytes, batch_size: int) -> tuple[int, Iterator[tuple[int, bytes]]]:
    try:
        rows = strict_json(data)
    except ValueError as error:
        raise ImportFailed(f"the file is not valid JSON: {error}") from None
    if not isinstance(rows, list):
        raise ImportFailed("a .json file must hold an array of contacts")
    batches = (
        (start, json.dumps(rows[start : start + batch_size]).encode())
        for start in range(0, max(len(rows), 1), batch_size)
    )
    return len(rows), batches


def _refusal(response: httpx.Response) -> str:
    try:
        error = response.json()["error"]
        return f"{response.status_code} {error['code']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        return f"{response.status_code}: {response.text[:200]}"


def import_file(
    path: Path,
    url: str,
    token: str,
    segment_id: UUID | None,
    batch_size: int = MAX_ROWS,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Import ``path`` (CSV, or a JSON array if it ends in ``.json``); the summed report.

    ``progress``, if given, hears of every request sent and answered."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ImportFailed(f"cannot read {path}: {error.strerror or error}") from None
    is_json = path.suffix.lower() == ".json"
    total, batches = (
        _json_batches(data, batch_size) if is_json else _csv_batches(data, batch_size)
    )
    content_type = "application/json" if is_json else "text/csv"
    params = {} if segment_id is None else {"segment_id": str(segment_id)}
    report: dict[str, Any] = {
        "object": "contact_import", "file": str(path), "requests": 0, "rows": 0, "created": 0,
        "updated": 0, "rejected_count": 0, "rejected": [],
        "segment_id": None if segment_id is None else str(segment_id), "added_to_segment": 0,
    }
    headers = {"Authorization": f"Bearer {token}", "Content-Type": content_type}
    if progress is not None:
        progress.begin(total)
    with (
        httpx.Client(base_url=url, headers=headers, timeout=REQUEST_TIMEOUT_SECONDS) as client,
        _stopping(progress),
    ):
        for offset, body in batches:
            if progress is not None:
                progress.sent(offset + 1, min(offset + batch_size, total))
            try:
                response = client.post("/contacts/import", content=body, params=params)
            except httpx.HTTPError as error:
                last = min(offset + batch_size, total)
                done = f"rows 1 to {offset} were imported; " if offset else ""
                raise ImportFailed(
                    f"cannot reach {url}: {error} ({done}rows {offset + 1} to {last} may or "
                    "may not have been: importing them again is safe, rows are matched by email)"
                ) from None
            if progress is not None:
                progress.stopped()
            if not response.is_success:
                done = f" (rows 1 to {offset} were imported)" if offset else ""
                raise ImportFailed(f"the service refused the import: {_refusal(response)}{done}")
            result = response.json()["data"]
            report["requests"] += 1
            for name in ("rows", "created", "updated", "rejected_count", "added_to_segment"):
                report[name] += result[name]
            room = MAX_LISTED_REJECTIONS - len(report["rejected"])
            for rejection in result["rejected"][: max(room, 0)]:
                report["rejected"].append({**rejection, "row": rejection["row"] + offset})
            if progress is not None:
                progress.imported(report["rows"])
    return report


@contextmanager
def _stopping(progress: Progress | None) -> Iterator[None]:
    """The reminder thread of ``progress`` ends however the import ends."""
    try:
        yield
    finally:
        if progress is not None:
            progress.stopped()
