"""Bounce addresses: the envelope sender of one email to one recipient (VERP).

Every recipient of an email gets its own return path on the sending
domain's return-path host, ``<local>@bounces.<domain>``. The local part is
base32 (RFC 4648, lower case, no padding; 34 characters) of 21 bytes::

    email id (16 bytes) | tag (5 bytes)

``tag`` is the first 5 bytes of HMAC-SHA256(key, ``b"bounce v1"`` + email
id + the recipient as handed to SMTP, lower-cased). A report that came back
to such an address speaks for that email and that recipient only: a
co-recipient, who sees its own return path, cannot make one for another
address. Decoding ignores case (MTAs may change it) but takes only the
spelling ``address`` writes.

The key: derived from ``TIDINGS_SECRET_KEY`` when it is set, else one kept
in the database (``service_keys``, name ``bounce-addresses``), so every
process and every restart makes and checks the same addresses.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass
from uuid import UUID

from tidings.email.records import RETURN_PATH_LABEL

VERSION = b"bounce v1"
TAG_BYTES = 5
# 16 + 5 bytes in base32 without padding: ceil(21 * 8 / 5).
LOCAL_LENGTH = 34
# What the key derived from TIDINGS_SECRET_KEY is for (never used for anything else).
PURPOSE = b"tidings bounce addresses v1"
KEY_NAME = "bounce-addresses"
_PADDING = "=" * (-LOCAL_LENGTH % 8)


@dataclass(frozen=True)
class BounceAddress:
    """What a bounce address says: the email, the tag, and the sending domain."""

    email_id: UUID
    tag: bytes
    domain: str


def _local(email_id: UUID, tag: bytes) -> str:
    return base64.b32encode(email_id.bytes + tag).decode("ascii").rstrip("=").lower()


class BounceKey:
    """The key that tags bounce addresses."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 32:
            raise ValueError("a bounce address key has at least 32 bytes")
        self._key = key

    @classmethod
    def derived(cls, secret_key: bytes) -> BounceKey:
        """The key that TIDINGS_SECRET_KEY gives."""
        return cls(hmac.new(secret_key, PURPOSE, hashlib.sha256).digest())

    def tag(self, email_id: UUID, recipient: str) -> bytes:
        message = VERSION + email_id.bytes + recipient.lower().encode("utf-8", "surrogatepass")
        return hmac.new(self._key, message, hashlib.sha256).digest()[:TAG_BYTES]

    def address(self, email_id: UUID, recipient: str, return_path_host: str) -> str:
        """The return path of ``email_id`` to ``recipient`` (one HMAC)."""
        return f"{_local(email_id, self.tag(email_id, recipient))}@{return_path_host}"

    def vouches(self, address: BounceAddress, email_id: UUID, recipient: str) -> bool:
        """True when ``address`` is the one made for ``email_id`` and ``recipient``."""
        return address.email_id == email_id and hmac.compare_digest(
            address.tag, self.tag(email_id, recipient)
        )


def parse_bounce_address(address: str) -> BounceAddress | None:
    """The bounce address ``address`` is, in any case; None when it is none
    (an untagged ``<email id>@bounces.<domain>`` included)."""
    local, _, host = address.strip().strip("<>").rpartition("@")
    host = host.lower().rstrip(".")
    prefix = RETURN_PATH_LABEL + "."
    if len(local) != LOCAL_LENGTH or not host.startswith(prefix) or not local.isascii():
        return None
    try:
        raw = base64.b32decode(local.upper() + _PADDING)
    except (binascii.Error, ValueError):
        return None
    email_id, tag = UUID(bytes=raw[:16]), raw[16:]
    # Only the spelling ``address`` writes: the last character's spare bits are zero.
    if _local(email_id, tag) != local.lower():
        return None
    return BounceAddress(email_id, tag, host.removeprefix(prefix))
