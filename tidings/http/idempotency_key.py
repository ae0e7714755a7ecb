"""The ``Idempotency-Key`` of a request, and what makes two requests the same
(the spec's Idempotency rules 1 and 2). Pure: the trio side reads them before
the request's storage work."""

from __future__ import annotations

import hashlib
import re

from tidings.http.envelope import bad_request

IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 256
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def one_key_header(values: list[str]) -> str | None:
    """The one ``Idempotency-Key`` header's value, if any. Several are refused:
    which one a proxy or a framework would pick is anyone's guess, as for
    ``Authorization``."""
    if len(values) > 1:
        raise bad_request(f"more than one {IDEMPOTENCY_HEADER} header: send exactly one")
    return values[0] if values else None


def idempotency_key(raw: str | None) -> str | None:
    if raw is None:
        return None
    try:
        # Header values arrive as latin-1; a non-ASCII key is sent as UTF-8.
        # Bytes that are not UTF-8 are no text: read as latin-1 instead, they
        # would be the same key as another client's UTF-8 spelling.
        raw = raw.encode("latin-1").decode("utf-8")
    except UnicodeError:
        raise bad_request(f"{IDEMPOTENCY_HEADER}: must be UTF-8 text") from None
    key = raw.strip()
    if not key:
        raise bad_request(f"{IDEMPOTENCY_HEADER}: must not be empty")
    if _CONTROL.search(key):
        raise bad_request(f"{IDEMPOTENCY_HEADER}: control characters are not allowed")
    if len(key) > MAX_KEY_LENGTH:
        raise bad_request(
            f"{IDEMPOTENCY_HEADER}: at most {MAX_KEY_LENGTH} characters, got {len(key)}"
        )
    return key


def fingerprint(method: str, path: str, query_string: bytes, raw_body: bytes) -> bytes:
    """Method, route path, query string and body: what makes two requests the
    same. Spellings of one path that reach one route (``/a/``, ``//a``) are one."""
    digest = hashlib.sha256()
    route_path = "/" + "/".join(part for part in path.split("/") if part)
    for part in (method.encode(), route_path.encode(), query_string):
        digest.update(part)
        digest.update(b"\n")
    digest.update(raw_body)
    return digest.digest()
