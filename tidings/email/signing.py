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
# Where the signature's header folds (dkimpy's column); a value longer than
# a line (d= of a long domain) goes whole on a line of its own, within 998.
LINE = 72

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
    name = b"DKIM-Signature"
    # What is hashed is what is sent, up to the empty b= that ends it.
    unsigned = _fold(_units(fields), LINE - len(name) - 2)
    hasher = hashlib.sha256()
    dkim.hash_headers(
        hasher, CANONICALIZATION, CANONICALIZATION.canonicalize_headers(headers),
        include, (name, b" " + unsigned), dict(fields),
    )
    signature = _key(private_key_pem).sign(
        hasher.digest(), padding.PKCS1v15(), utils.Prehashed(hashes.SHA256())
    )
    head = name + b": " + unsigned
    column = len(head) - (head.rfind(b"\n") + 1)
    return head + _fold_value(base64.b64encode(signature), column) + b"\r\n"


def _units(fields: list[tuple[bytes, bytes]]) -> list[bytes]:
    """The tag list as the pieces a fold may go between: each tag with its
    ``;``, and the names and colons of ``h=`` apart (FWS is allowed around
    its colons). A value is never cut: whitespace inside ``d=`` or ``s=``
    would make another domain or selector (RFC 6376 §3.2)."""
    units: list[bytes] = []
    for position, (tag, value) in enumerate(fields):
        end = b"" if position == len(fields) - 1 else b";"
        if tag == b"h":
            first, *rest = value.split(b" : ")
            units.append(b"h=" + first)
            for header in rest:
                units += [b":", header]
            units[-1] += end
        else:
            units.append(tag + b"=" + value + end)
    return units


def _fold(units: list[bytes], width: int) -> bytes:
    """``units`` joined by spaces, the line folded (CRLF before the space)
    ahead of a unit that would pass column ``LINE``; ``width``: the room on
    the first line. A unit longer than a line has one of its own."""
    lines: list[bytes] = []
    line = b""
    for unit in units:
        if line and len(line) + 1 + len(unit) > width:
            lines.append(line)
            line, width = unit, LINE - 1
        else:
            line = line + b" " + unit if line else unit
    lines.append(line)
    return b"\r\n ".join(lines)


def _fold_value(value: bytes, column: int) -> bytes:
    """The ``b=`` value for a line at ``column``, folded to lines of ``LINE``
    columns: whitespace inside it is ignored (RFC 6376 §3.5)."""
    room = max(LINE - column, 0)
    rest = value[room:]
    return value[:room] + b"".join(
        b"\r\n " + rest[start:start + LINE - 1] for start in range(0, len(rest), LINE - 1)
    )


def sign(message: bytes, domain: str, selector: str, private_key_pem: bytes) -> bytes:
    """``message`` with its DKIM signature on top."""
    return dkim_signature(message, domain, selector, private_key_pem) + message
