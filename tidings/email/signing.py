"""DKIM signatures (RFC 6376) on outgoing messages: rsa-sha256, relaxed/relaxed.

dkimpy does the DKIM work: parsing the message, canonicalising headers and
body, choosing and hashing the signed headers, folding the header. The one
RSA operation per message is OpenSSL's (``cryptography``), about 25 times
faster than dkimpy's pure-Python arithmetic (about 1 ms against 21 ms for a
2048-bit key here) and run without the GIL, so signing scales across
threads. Loading a PEM key costs tens of milliseconds, so loaded keys are
kept (a few hundred, the oldest loaded dropped first).
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections import OrderedDict
from threading import Lock

import dkim
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa, utils
from dkim.canonicalization import CanonicalizationPolicy

# Signed when present; From always. Listing a header once more than it
# occurs ("oversigning") keeps anyone from adding one after signing; an
# oversigned header that is absent is listed once, which signs its absence
# (RFC 6376 §5.4.2): a Cc or Reply-To added later breaks the signature.
SIGNED_HEADERS: tuple[bytes, ...] = (
    b"from", b"to", b"cc", b"reply-to", b"subject", b"date", b"message-id",
    b"mime-version", b"content-type", b"content-transfer-encoding",
    b"list-unsubscribe", b"list-unsubscribe-post",
)
OVERSIGNED: frozenset[bytes] = frozenset({b"from", b"subject", b"to", b"cc", b"reply-to"})
CANONICALIZATION = CanonicalizationPolicy.from_c_value(b"relaxed/relaxed")
KEY_CACHE_SIZE = 512

_keys: OrderedDict[bytes, rsa.RSAPrivateKey] = OrderedDict()
_keys_lock = Lock()


def _key(pem: bytes) -> rsa.RSAPrivateKey:
    # A hit takes no lock: a dict lookup is atomic, and render threads share keys.
    key = _keys.get(pem)
    if key is not None:
        return key
    loaded = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(loaded, rsa.RSAPrivateKey):
        raise ValueError("a DKIM key must be an RSA key")
    with _keys_lock:
        _keys[pem] = loaded
        while len(_keys) > KEY_CACHE_SIZE:
            _keys.popitem(last=False)  # the oldest loaded
    return loaded


def dkim_signature(message: bytes, domain: str, selector: str, private_key_pem: bytes) -> bytes:
    """The ``DKIM-Signature: ...\\r\\n`` header line to put on top of ``message``.

    CPU work (about a millisecond): call it from a worker thread.
    """
    headers, body = dkim.rfc822_parse(message)
    present = [name.lower() for name, _ in headers]
    include = [name for name in SIGNED_HEADERS if name in present]
    include += [name for name in SIGNED_HEADERS if name in OVERSIGNED]
    body_hash = base64.b64encode(
        hashlib.sha256(CANONICALIZATION.canonicalize_body(body)).digest()
    )
    fields = [
        (b"v", b"1"),
        (b"a", b"rsa-sha256"),
        (b"c", b"relaxed/relaxed"),
        (b"d", domain.encode("ascii")),
        (b"s", selector.encode("ascii")),
        (b"t", str(int(time.time())).encode("ascii")),
        # Spaces around the colons let the header fold between names.
        (b"h", b" : ".join(include)),
        (b"bh", body_hash),
        (b"b", b""),
    ]
    unsigned = b"; ".join(b"=".join(field) for field in fields)
    name = b"DKIM-Signature"
    hasher = hashlib.sha256()
    dkim.hash_headers(
        hasher, CANONICALIZATION, CANONICALIZATION.canonicalize_headers(headers),
        include, (name, b" " + dkim.fold(unsigned, namelen=len(name))), dict(fields),
    )
    signature = _key(private_key_pem).sign(
        hasher.digest(), padding.PKCS1v15(), utils.Prehashed(hashes.SHA256())
    )
    signed = unsigned + base64.b64encode(signature)
    folded: bytes = dkim.fold(signed, namelen=len(name))
    return name + b": " + folded + b"\r\n"


def sign(message: bytes, domain: str, selector: str, private_key_pem: bytes) -> bytes:
    """``message`` with its DKIM signature on top."""
    return dkim_signature(message, domain, selector, private_key_pem) + message
