"""``python -m bench import``: bulk import of contacts into one segment.

Starts a fresh service with the rate limit off, creates a token, a string
contact property (``plan``) and a segment, then imports ``--rows`` contacts
(email, first and last name, plan) into that segment: over HTTP in requests
of ``--batch`` rows sent one after the other, or with ``tidings contacts
import`` on one file. Only the import is timed; building the bodies is not.
Then it checks that the segment holds every row, and imports the same rows
again (all updates) to time that case too. Reports rows per second and
seconds for each pass.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import time
from pathlib import Path
from typing import Any

import httpx

from bench.harness import HarnessError, Service, log, running_service

PLANS = ("free", "pro", "team", "enterprise")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=100_000, help="contacts to import")
    parser.add_argument("--batch", type=int, default=50_000, help="rows per HTTP request")
    parser.add_argument("--format", choices=("csv", "json"), default="csv")
    parser.add_argument(
        "--via", choices=("http", "cli"), default="http",
        help="POST the batches, or run `tidings contacts import` on one file",
    )


def csv_body(start: int, stop: int) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["email", "first_name", "last_name", "plan"])
    for n in range(start, stop):
        writer.writerow([f"person{n}@example{n % 97}.com", f"First{n}", f"Last{n}", PLANS[n % 4]])
    return out.getvalue().encode()


def json_body(start: int, stop: int) -> bytes:
    return json.dumps([
        {
            "email": f"person{n}@example{n % 97}.com",
            "first_name": f"First{n}",
            "last_name": f"Last{n}",
            "properties": {"plan": PLANS[n % 4]},
        }
        for n in range(start, stop)
    ]).encode()


def _data(response: httpx.Response) -> Any:
    if not response.is_success:
        raise HarnessError(f"{response.request.method} {response.request.url.path}: "
                           f"{response.status_code} {response.text[:300]}")
    return response.json()["data"]


def _import_http(
    client: httpx.Client, bodies: list[bytes], content_type: str, segment_id: str
) -> tuple[float, list[dict[str, Any]]]:
    reports = []
    started = time.perf_counter()
    for body in bodies:
        reports.append(_data(client.post(
            "/contacts/import", content=body, params={"segment_id": segment_id},
            headers={"Content-Type": content_type},
        )))
    return time.perf_counter() - started, reports


def _import_cli(
    service: Service, path: Path, token: str, segment_id: str, batch: int
) -> tuple[float, list[dict[str, Any]]]:
    started = time.perf_counter()
    out = service.cli(
        "contacts", "import", str(path), "--team-token", token, "--segment-id", segment_id,
        "--url", service.base_url, "--batch-size", str(batch), timeout=600,
    )
    seconds = time.perf_counter() - started
    return seconds, [json.loads(out.strip().splitlines()[-1])]


def _pass(name: str, rows: int, seconds: float, reports: list[dict[str, Any]]) -> dict[str, Any]:
    created = sum(report["created"] for report in reports)
    updated = sum(report["updated"] for report in reports)
    rejected = sum(report["rejected_count"] for report in reports)
    if created + updated != rows or rejected:
        raise HarnessError(f"{name}: {created} created, {updated} updated, {rejected} rejected "
                           f"of {rows} rows: {reports[0]['rejected'][:3]}")
    log(f"{name}: {rows} rows in {seconds:.2f}s ({rows / seconds:.0f} rows/s)")
    return {
        "seconds": round(seconds, 3),
        "rows_per_s": round(rows / seconds),
        "created": created,
        "updated": updated,
    }


def run(args: argparse.Namespace) -> dict[str, object]:
    if not 1 <= args.batch <= 50_000:
        raise HarnessError("--batch must be 1 to 50000")
    make = csv_body if args.format == "csv" else json_body
    content_type = "text/csv" if args.format == "csv" else "application/json"
    starts = range(0, args.rows, args.batch)
    bounds = [(start, min(start + args.batch, args.rows)) for start in starts]
    log(f"building {len(bounds)} {args.format} bodies of up to {args.batch} rows")
    bodies = [make(start, stop) for start, stop in bounds]
    with running_service({"TIDINGS_RATE_LIMIT_PER_SECOND": "0"}) as service:
        token = service.create_token("bench")
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=service.base_url, headers=headers, timeout=600) as client:
            _data(client.post("/contact-properties", json={"key": "plan", "type": "string"}))
            segment_id = _data(client.post("/segments", json={"name": "bench"}))["id"]
            passes: dict[str, Any] = {}
            for name in ("first", "again"):
                if args.via == "cli":
                    path = service.workdir / f"contacts.{args.format}"
                    if args.format == "csv":
                        path.write_bytes(csv_body(0, args.rows))
                    else:
                        path.write_bytes(json_body(0, args.rows))
                    seconds, reports = _import_cli(service, path, token, segment_id, args.batch)
                else:
                    seconds, reports = _import_http(client, bodies, content_type, segment_id)
                passes[name] = _pass(name, args.rows, seconds, reports)
            members = _data(client.get(f"/segments/{segment_id}"))["contact_count"]
            if members != args.rows:
                raise HarnessError(f"the segment has {members} contacts, not {args.rows}")
        peak_rss_mb = service.peak_rss_mb()
        shutdown = service.stop()
    return {
        "bench": "import",
        "rows": args.rows,
        "batch": args.batch,
        "format": args.format,
        "via": args.via,
        "seconds": passes["first"]["seconds"],
        "rows_per_s": passes["first"]["rows_per_s"],
        "first": passes["first"],
        "again": passes["again"],
        "segment_contacts": members,
        "service_peak_rss_mb": peak_rss_mb,
        "shutdown_exit_code": shutdown.exit_code,
    }
