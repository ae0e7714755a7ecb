"""What a webhook URL must be before Tidings stores it (docs/webhooks.md, ``url``).

An absolute ``http://`` or ``https://`` URL of at most ``MAX_URL_LENGTH``
ASCII characters, without control characters, white space or credentials,
naming a valid host (a name or an address literal) and, if it names a port,
one from 1 to 65535. Whether the host may be reached at all (not loopback,
private ...) is the guard's question (``safety.py``), asked after this one.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import idna

MAX_URL_LENGTH = 2048
MAX_HOST_LENGTH = 253
MAX_LABEL_LENGTH = 63
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?")


def _control(ch: str) -> bool:
    """C0 controls and DEL: never part of a URL, and never sent on a request line."""
    return ch < " " or ch == "\x7f"


def check_host(host: str) -> None:
    """Refuse what cannot be a host name or an address literal (ValueError).

    A name is at most 253 characters of dot-separated labels of 1 to 63
    letters, digits and hyphens, none starting or ending with a hyphen; a
    label starting ``xn--`` must be a valid international (punycode) label.
    """
    if "%" in host:
        raise ValueError(f"{host!r} is not a valid host name (a host may not be percent-encoded)")
    if ":" in host:  # an IPv6 literal (urlsplit has checked the brackets)
        return
    name = host[:-1] if host.endswith(".") else host
    if len(name) > MAX_HOST_LENGTH:
        raise ValueError(f"the host name is longer than {MAX_HOST_LENGTH} characters")
    for label in name.split("."):
        if not label:
            raise ValueError(f"{host!r} is not a valid host name (an empty label)")
        if len(label) > MAX_LABEL_LENGTH:
            raise ValueError(
                f"{host!r} is not a valid host name (a label longer than {MAX_LABEL_LENGTH})"
            )
        if not _HOST_LABEL.fullmatch(label):
            raise ValueError(
                f"{host!r} is not a valid host name (only letters, digits and inner "
                "hyphens in each label)"
            )
        if label[:4].lower() == "xn--":
            try:
                idna.decode(label)
            except (idna.IDNAError, UnicodeError):
                raise ValueError(
                    f"{host!r} is not a valid host name ({label!r} is not a valid xn-- label)"
                ) from None


def check_url(url: str) -> str:
    """``url`` if Tidings may store it as an endpoint's; ValueError saying why not."""
    if any(_control(ch) for ch in url):
        raise ValueError("must not contain control characters")
    if any(ch.isspace() for ch in url):
        raise ValueError("must not contain whitespace")
    if not url.isascii():
        raise ValueError(
            "must be ASCII: write an international domain name in its xn-- form "
            "and percent-encode other characters"
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise ValueError(f"is not a valid URL ({error})") from None
    if parts.scheme not in ("https", "http"):
        raise ValueError("must be an absolute https:// or http:// URL")
    if not parts.hostname:
        raise ValueError("must name a host")
    check_host(parts.hostname)
    if port == 0:
        raise ValueError("port 0 is not a port a receiver can listen on")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry credentials")
    return url
