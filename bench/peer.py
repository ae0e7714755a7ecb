"""The peer reference of ``python -m bench api``: Starlette + uvicorn + asyncpg.

The figure issue 11 compares ``tidings serve --workers 2`` with was taken from
an app of this kind, on a machine whose speed changes with what else runs on
it. This is that app, run beside Tidings in the same benchmark, on the same
PostgreSQL, so the comparison is made in one run:

- ``POST /contacts``: the bearer token looked up by its SHA-256 in
  ``api_tokens`` (no cache), the body parsed and its email checked with
  email-validator, one ``INSERT`` into ``contacts``, and the ``{"data": ...}``
  envelope, 201;
- with an ``Idempotency-Key``: in ONE transaction, the key claimed in
  ``idempotency_keys``, the contact inserted and the response stored (a
  concurrent duplicate waits for the first to commit; a second request with
  the key is answered from the record).

uvicorn runs one process with uvloop and httptools, its access log on (as
Tidings writes one). It is a reference for speed, not a second
implementation: no permissions, rate limit or error envelopes beyond what
the benchmark's requests reach. Run as
``python -m bench.peer --port N --dsn postgresql://...``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import uvicorn
from email_validator import EmailNotValidError, validate_email
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

TOKEN = """
SELECT team_id FROM api_tokens
WHERE secret_hash = $1 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
"""
INSERT_CONTACT = """
INSERT INTO contacts (team_id, email, first_name) VALUES ($1, $2, $3)
RETURNING id, email, first_name, last_name, unsubscribed, properties, created_at
"""
CLAIM = """
INSERT INTO idempotency_keys (scope, key, fingerprint, claim, status, locked_until, expires_at)
VALUES ($1, $2, $3, gen_random_uuid(), 'processing', now() + interval '30 seconds',
        now() + interval '1 day')
ON CONFLICT (scope, key) DO NOTHING
RETURNING 1
"""
STORED = "SELECT response_status, response_body FROM idempotency_keys WHERE scope = $1 AND key = $2"
COMPLETE = """
UPDATE idempotency_keys SET status = 'completed', response_status = 201, response_body = $3
WHERE scope = $1 AND key = $2
"""


def error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status)


def make_app(dsn: str) -> Starlette:
    pool: asyncpg.Pool | None = None

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        nonlocal pool
        pool = await asyncpg.create_pool(dsn, min_size=10, max_size=10)
        yield
        await pool.close()

    async def create_contact(request: Request) -> Response:
        scheme, _, secret = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secret:
            return error(401, "UNAUTHORIZED", "missing bearer token")
        raw = await request.body()
        try:
            body = json.loads(raw)
            email = validate_email(body["email"], check_deliverability=False).normalized
        except (ValueError, KeyError, TypeError, EmailNotValidError) as exc:
            return error(400, "VALIDATION_ERROR", str(exc))
        key = request.headers.get("idempotency-key")
        assert pool is not None
        async with pool.acquire() as conn:
            team_id = await conn.fetchval(TOKEN, hashlib.sha256(secret.encode()).digest())
            if team_id is None:
                return error(401, "UNAUTHORIZED", "invalid token")
            if key is None:
                row = await conn.fetchrow(INSERT_CONTACT, team_id, email, body.get("first_name"))
                return Response(envelope(row), 201, media_type="application/json")
            fingerprint = hashlib.sha256(b"POST /contacts\n" + raw).digest()
            async with conn.transaction():
                if await conn.fetchval(CLAIM, team_id, key, fingerprint) is None:
                    stored = await conn.fetchrow(STORED, team_id, key)
                    return Response(bytes(stored["response_body"] or b""),
                                    stored["response_status"] or 409,
                                    media_type="application/json")
                row = await conn.fetchrow(INSERT_CONTACT, team_id, email, body.get("first_name"))
                answer = envelope(row)
                await conn.execute(COMPLETE, team_id, key, answer)
            return Response(answer, 201, media_type="application/json")

    async def healthz(request: Request) -> Response:
        return JSONResponse({})

    return Starlette(routes=[
        Route("/contacts", create_contact, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
    ], lifespan=lifespan)


def envelope(row: asyncpg.Record) -> bytes:
    data: dict[str, Any] = {
        "object": "contact", "id": str(row["id"]), "email": row["email"],
        "first_name": row["first_name"], "last_name": row["last_name"],
        "unsubscribed": row["unsubscribed"], "properties": json.loads(row["properties"]),
        "created_at": row["created_at"].isoformat(),
    }
    return json.dumps({"data": data}).encode()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dsn", required=True)
    args = parser.parse_args()
    uvicorn.run(make_app(args.dsn), host=args.host, port=args.port, loop="uvloop",
                http="httptools", log_level="info", access_log=True)
