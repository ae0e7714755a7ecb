"""Sending domain names: what Tidings accepts and the one form it stores.

A name is a host name under a public suffix, given with or without a trailing
dot, in any case. Internationalised names (``bücher.example``) are accepted
and stored in their ASCII form (``xn--bcher-kva.example``), which is what DNS
and the SMTP envelope carry; the API shows that form.

A sending domain is shorter than DNS allows, so that every name and address
made from it fits: see ``MAX_SENDING_LENGTH``.
"""

from __future__ import annotations

import ipaddress
import re

import email_validator
import idna

from tidings.email.bounce_addresses import LOCAL_LENGTH
from tidings.email.records import return_path_host

LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
MAX_LENGTH = 253
# A sending domain's longest derived name is its bounce address, a tagged
# local part at the return-path host: ``<local>@bounces.<name>``. An SMTP
# path is at most 256 octets with its angle brackets (RFC 5321 §4.5.3.1.3),
# so the address is at most 254, and the name 209. The DKIM record name,
# ``tidings<6 hex>._domainkey.<name>``, needs only <= 228 to stay within
# DNS's 253.
MAX_BOUNCE_ADDRESS = 254
# The local part the limit was set for: an email's id (a UUID, 36
# characters), the bounce address before it was tagged. The tagged one
# (``bounce_addresses.LOCAL_LENGTH``, 34) is shorter and the limit stays
# 209, the one published and that stored domains were held to: a tagged
# address of the longest name has two octets to spare.
MAX_LOCAL_PART = 36
assert LOCAL_LENGTH <= MAX_LOCAL_PART
MAX_SENDING_LENGTH = (
    MAX_BOUNCE_ADDRESS - MAX_LOCAL_PART - len("@") - len(return_path_host(""))
)

def domain_name(raw: str) -> str:
    """``raw`` as a lower-case ASCII domain name; ValueError says why it is not one."""
    name = raw.strip().removesuffix(".")
    if not name:
        raise ValueError("must be a domain name such as example.com")
    if "@" in name or "/" in name or ":" in name or " " in name:
        raise ValueError(f"{raw!r} is not a domain name (give only the domain, e.g. example.com)")
    try:
        ipaddress.ip_address(name)
    except ValueError:
        pass
    else:
        raise ValueError("must be a domain name, not an IP address")
    if not name.isascii():
        try:
            name = idna.encode(name, uts46=True).decode("ascii")
        except idna.IDNAError as error:
            raise ValueError(
                f"{raw!r} is not a valid internationalised domain name: {error}"
            ) from None
    name = name.lower()
    if len(name) > MAX_LENGTH:
        raise ValueError(f"must be at most {MAX_LENGTH} characters")
    labels = name.split(".")
    if len(labels) < 2:
        raise ValueError("must have at least two labels, e.g. example.com")
    for label in labels:
        if not LABEL.match(label):
            raise ValueError(
                f"label {label!r} must be 1 to 63 letters, digits or hyphens, "
                "not starting or ending with a hyphen"
            )
        if label.startswith("xn--"):
            try:
                idna.decode(label)
            except idna.IDNAError:
                raise ValueError(f"label {label!r} is not a valid xn-- label") from None
    if labels[-1].isdigit():
        raise ValueError("the last label must not be all digits")
    return name


def sending_domain_name(raw: str) -> str:
    """``domain_name(raw)``, refusing the special-use names (RFC 6761: ``.test``,
    ``.invalid``, ``.localhost`` and the like) that no address can be sent
    from: the same list that the address check (email-validator) applies,
    and names longer than ``MAX_SENDING_LENGTH``, whose bounce address would
    not fit an SMTP path."""
    name = domain_name(raw)
    if len(name) > MAX_SENDING_LENGTH:
        raise ValueError(
            f"must be at most {MAX_SENDING_LENGTH} characters (in its ASCII form) for a "
            "sending domain, so that its DKIM record name and bounce address fit "
            f"(this one has {len(name)})"
        )
    for special in email_validator.SPECIAL_USE_DOMAIN_NAMES:
        if name == special or name.endswith("." + special):
            raise ValueError(
                f"{name} is under .{special}, a special-use name that email cannot be "
                "sent from"
            )
    return name
