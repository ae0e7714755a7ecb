"""Schemathesis against the real server: no 5xx, nothing outside the document.

Property-based requests (valid and invalid) for every operation of
GET /openapi.json, bounded to a few cases each so that the run stays
under a minute here. A response that is a 5xx, has a status, media type or
body the document does not declare, fails the test with schemathesis's report.
"""

from __future__ import annotations

import subprocess
import sys

import httpx
import trio

from tests.conftest import Credential

CHECKS = ",".join([
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
])


async def test_schemathesis_finds_nothing_outside_the_document(
    base_url: str, http: httpx.AsyncClient, acme: Credential
) -> None:
    command = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{base_url}/openapi.json",
        "--header", f"Authorization: Bearer {acme.secret}",
        # One connection per request: a request the server answers without
        # reading its body must not leave the next one waiting.
        "--header", "Connection: close",
        "--checks", CHECKS,
        "--phases", "fuzzing",
        "--mode", "all",
        "--max-examples", "4",
        "--seed", "20261123",
        "--no-shrink",
        # One worker: hypothesis describes strategies with ast.parse, which
        # CPython 3.11 may fail in concurrent threads (SystemError).
        "--workers", "1",
        "--request-timeout", "10",
        "--suppress-health-check", "all",
    ]
    done = await trio.run_process(
        command, capture_stdout=True, stderr=subprocess.STDOUT, check=False
    )
    report = done.stdout.decode(errors="replace")
    assert done.returncode == 0, report[-8000:]
    assert "passed" in report
