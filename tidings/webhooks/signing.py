"""The signature scheme: Stripe-compatible ``t=<unix seconds>,v1=<hex>``.

``v1`` is the lowercase hex HMAC-SHA256 of ``"<t>." + body``, keyed with the
endpoint secret string (``whsec_...``) as UTF-8. While a rotated-out secret is
still valid the header carries one ``v1`` per secret, newest first, so a
receiver holding either secret accepts the request.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Sequence
from typing import Any

DEFAULT_TOLERANCE_SECONDS = 300


class WebhookVerificationError(ValueError):
    """The request is not a genuine, fresh Tidings webhook."""


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The ``v1`` signature of ``body`` sent at ``timestamp``."""
    message = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def signature_header(secrets: Sequence[str], timestamp: int, body: bytes) -> str:
    """The ``X-Service-Signature`` value: one ``v1`` per secret."""
    parts = [f"t={timestamp}"]
    parts.extend(f"v1={sign(secret, timestamp, body)}" for secret in secrets)
    return ",".join(parts)


class Signer:
    """Signs with a fixed list of secrets; each secret's keyed HMAC is set up once."""

    def __init__(self, secrets: Sequence[str]) -> None:
        self.secrets = tuple(secrets)
        self._keyed = [hmac.new(secret.encode(), digestmod=hashlib.sha256) for secret in secrets]

    def header(self, timestamp: int, body: bytes) -> bytes:
        """The ``X-Service-Signature`` value, as :func:`signature_header` makes it."""
        prefix = b"%d." % timestamp
        parts = [b"t=%d" % timestamp]
        for keyed in self._keyed:
            mac = keyed.copy()
            mac.update(prefix)
            mac.update(body)
            parts.append(b"v1=" + mac.hexdigest().encode())
        return b",".join(parts)


def _parse(header: str) -> tuple[int, list[str]]:
    timestamp: int | None = None
    signatures: list[str] = []
    for item in header.split(","):
        name, sep, value = item.strip().partition("=")
        if not sep:
            continue
        if name == "t":
            try:
                timestamp = int(value)
            except ValueError:
                raise WebhookVerificationError("the signature header has a bad timestamp") from None
        elif name == "v1":
            signatures.append(value)
    if timestamp is None:
        raise WebhookVerificationError("the signature header has no timestamp")
    if not signatures:
        raise WebhookVerificationError("the signature header has no v1 signature")
    return timestamp, signatures


def verify(
    payload: bytes,
    header: str,
    secrets: list[str],
    tolerance: int = DEFAULT_TOLERANCE_SECONDS,
    *,
    now: float | None = None,
) -> dict[str, Any]:
    """Check a webhook request and return its event.

    ``payload`` is the raw request body exactly as received, ``header`` the
    ``X-Service-Signature`` value, ``secrets`` the endpoint secrets you
    accept (during a rotation, both). Raises WebhookVerificationError when no
    signature matches any secret, or when the timestamp is more than
    ``tolerance`` seconds away from now (a replayed request).

    Empty (or white-space-only) secrets are skipped: anyone can sign with
    an empty key, so one left by ``"whsec_a,".split(",")`` must not verify.
    ``secrets`` with no other secret raises WebhookVerificationError too
    (a ValueError), before the request is looked at.
    """
    if isinstance(secrets, str):
        # Iterating a string would try each character as a secret.
        raise TypeError("secrets must be a list of secret strings, not one string")
    secrets = [secret for secret in secrets if secret.strip()]
    if not secrets:
        raise WebhookVerificationError("no secret to verify with (empty secrets do not count)")
    timestamp, signatures = _parse(header)
    current = time.time() if now is None else now
    if tolerance > 0 and abs(current - timestamp) > tolerance:
        raise WebhookVerificationError("the signature timestamp is outside the tolerance")
    expected = [sign(secret, timestamp, payload) for secret in secrets]
    # Compare every pair, so the time taken says nothing about which matched.
    matched = False
    for candidate in signatures:
        for good in expected:
            matched |= hmac.compare_digest(candidate.encode(), good.encode())
    if not matched:
        raise WebhookVerificationError("no signature matches")
    try:
        event: dict[str, Any] = json.loads(payload)
    except ValueError:
        raise WebhookVerificationError("the body is not JSON") from None
    return event
