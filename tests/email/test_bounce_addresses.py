"""Bounce addresses: one per email and recipient, tagged with an HMAC."""

from __future__ import annotations

import base64
import hashlib
import hmac
from uuid import UUID, uuid4

from tidings.email.bounce_addresses import (
    LOCAL_LENGTH,
    BounceKey,
    parse_bounce_address,
)
from tidings.email.names import MAX_BOUNCE_ADDRESS, MAX_SENDING_LENGTH
from tidings.email.records import return_path_host

KEY = BounceKey(b"k" * 32)
ID = UUID("0f6c6f2e-3a1d-4a57-9a43-2b1c3d4e5f60")


def test_the_address_is_the_email_id_and_a_tag_in_base32() -> None:
    address = KEY.address(ID, "Ada@Example.org", "bounces.acme.example")
    local, _, host = address.partition("@")
    assert host == "bounces.acme.example" and len(local) == LOCAL_LENGTH == 34
    assert local == local.lower() and "=" not in local
    raw = base64.b32decode(local.upper() + "======")
    tag = hmac.new(b"k" * 32, b"bounce v1" + ID.bytes + b"ada@example.org",
                   hashlib.sha256).digest()[:5]
    assert raw == ID.bytes + tag


def test_an_address_decodes_in_any_case_and_vouches_for_its_recipient_only() -> None:
    address = KEY.address(ID, "ada@example.org", "bounces.acme.example")
    for spelling in (address, address.upper(), f"<{address}>", address + "."):
        found = parse_bounce_address(spelling)
        assert found is not None and found.email_id == ID and found.domain == "acme.example"
        assert KEY.vouches(found, ID, "ada@example.org")
        assert KEY.vouches(found, ID, "ADA@example.org")
        assert not KEY.vouches(found, ID, "bo@example.org")
        assert not KEY.vouches(found, uuid4(), "ada@example.org")
        assert not BounceKey(b"j" * 32).vouches(found, ID, "ada@example.org")


def test_what_is_no_bounce_address() -> None:
    address = KEY.address(ID, "ada@example.org", "bounces.acme.example")
    local, _, _ = address.partition("@")
    for other in (
        f"{ID}@bounces.acme.example",  # the untagged form of old
        f"{local}@acme.example",  # not the return-path host
        f"{local[:-1]}@bounces.acme.example",
        f"{local}a@bounces.acme.example",
        f"{local[:-1]}1@bounces.acme.example",  # not base32
        f"{local[:-1]}é@bounces.acme.example",
        "", "bounces.acme.example", "@bounces.acme.example",
    ):
        assert parse_bounce_address(other) is None, other
    # Only the spelling the key writes: the last character's two spare bits are zero.
    last = "abcdefghijklmnopqrstuvwxyz234567".index(local[-1])
    spare = "abcdefghijklmnopqrstuvwxyz234567"[last ^ 1]
    assert parse_bounce_address(f"{local[:-1]}{spare}@bounces.acme.example") is None


def test_the_key_from_the_secret_key_is_its_own() -> None:
    derived = BounceKey.derived(b"s" * 32)
    assert derived.tag(ID, "a@b.example") == BounceKey.derived(b"s" * 32).tag(ID, "a@b.example")
    assert derived.tag(ID, "a@b.example") != BounceKey(b"s" * 32).tag(ID, "a@b.example")


def test_a_bounce_address_of_the_longest_sending_domain_fits_an_smtp_path() -> None:
    name = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 17])
    assert len(name) == MAX_SENDING_LENGTH == 209
    address = KEY.address(ID, "ada@example.org", return_path_host(name))
    assert len(address) <= MAX_BOUNCE_ADDRESS - 2
