"""Signed unsubscribe tokens: the link in every broadcast email (CONTRACT §10).

A token names a team, a contact and a topic (or none: every broadcast), and
carries an HMAC-SHA256 of them, so it cannot be forged or altered. Layout,
base64url without padding (87 characters)::

    version (1 byte, 1) | team (16) | contact (16) | topic (16, nil: none) | mac (16)

``mac`` is the first 16 bytes of HMAC-SHA256(key, the 49 bytes before it).
The fanout signs a whole batch at once with ``signer``, which shares the
work that is the same for every contact of a broadcast.

The key: derived from ``TIDINGS_SECRET_KEY`` when it is set, else one kept
in the database (``service_keys``), so every process and every restart signs
and checks with the same key (docs/broadcasts.md).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from uuid import UUID

VERSION = 1
MAC_BYTES = 16
TOKEN_BYTES = 1 + 16 * 3 + MAC_BYTES
NIL = UUID(int=0)
# What the key derived from TIDINGS_SECRET_KEY is for (never used for anything else).
PURPOSE = b"tidings unsubscribe tokens v1"
KEY_NAME = "unsubscribe"


@dataclass(frozen=True)
class Unsubscribe:
    """What a valid token names."""

    team_id: UUID
    contact_id: UUID
    topic_id: UUID | None


class TokenKey:
    """The signing key of unsubscribe tokens."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 32:
            raise ValueError("an unsubscribe key has at least 32 bytes")
        self._key = key

    @classmethod
    def derived(cls, secret_key: bytes) -> TokenKey:
        """The key that TIDINGS_SECRET_KEY gives."""
        return cls(hmac.new(secret_key, PURPOSE, hashlib.sha256).digest())

    def _mac(self, message: bytes) -> bytes:
        return hmac.new(self._key, message, hashlib.sha256).digest()[:MAC_BYTES]

    def sign(self, team_id: UUID, contact_id: UUID, topic_id: UUID | None) -> str:
        message = bytes([VERSION]) + team_id.bytes + contact_id.bytes + (topic_id or NIL).bytes
        return self._signed(message)

    def signer(self, team_id: UUID, topic_id: UUID | None) -> Callable[[UUID], str]:
        """``sign`` for one team and topic, contact after contact: the HMAC of
        the common prefix is computed once."""
        head = bytes([VERSION]) + team_id.bytes
        tail = (topic_id or NIL).bytes
        # HMAC (RFC 2104) by hand, so that its two hashes can be copied as
        # they are after the common prefix: hmac's own copy() costs more than
        # the hashing of one token.
        key = self._key if len(self._key) <= 64 else hashlib.sha256(self._key).digest()
        key = key.ljust(64, b"\0")
        inner = hashlib.sha256(bytes(b ^ 0x36 for b in key) + head)
        outer = hashlib.sha256(bytes(b ^ 0x5C for b in key))
        encode = base64.urlsafe_b64encode

        def sign(contact_id: UUID) -> str:
            body = contact_id.bytes + tail
            digest = inner.copy()
            digest.update(body)
            mac = outer.copy()
            mac.update(digest.digest())
            raw = head + body + mac.digest()[:MAC_BYTES]
            return encode(raw).rstrip(b"=").decode("ascii")

        return sign

    def _signed(self, message: bytes) -> str:
        raw = message + self._mac(message)
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    def verify(self, token: str) -> Unsubscribe | None:
        """What ``token`` names, or None when it is not one this key signed."""
        if len(token) > 200 or not token.isascii():
            return None
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (binascii.Error, ValueError):
            return None
        if len(raw) != TOKEN_BYTES or raw[0] != VERSION:
            return None
        message, mac = raw[:-MAC_BYTES], raw[-MAC_BYTES:]
        if not hmac.compare_digest(mac, self._mac(message)):
            return None
        # The encoding must be the one sign() writes: no second spelling of a token.
        if self._signed(message) != token:
            return None
        topic = UUID(bytes=message[33:49])
        return Unsubscribe(
            UUID(bytes=message[1:17]), UUID(bytes=message[17:33]), None if topic == NIL else topic
        )


def unsubscribe_url(public_url: str, token: str) -> str:
    return f"{public_url.rstrip('/')}/unsubscribe/{token}"
