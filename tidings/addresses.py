"""Email addresses: one bare address, a mailbox with a display name, and lists.

Every group that takes an address (contacts, suppressions, templates, and the
sending routes) checks it here, so an address is accepted, refused and
normalised the same way everywhere:

- Syntax is email-validator's (no DNS lookup), plus the limits of RFC 5321
  §4.5.3.1, counted in UTF-8 octets: at most 64 before the ``@``, at most
  254 in all.
- Normalised as email-validator does it: surrounding spaces go, the domain is
  lowercased (and IDNA-normalised), the local part keeps its case, except the
  role mailboxes of RFC 2142 (``Postmaster@``...) which are lowercased.
- Two addresses are one recipient when they are equal after PostgreSQL's
  ``lower()``: contacts are unique by it, and storage compares by it. Python's
  ``str.lower`` folds a few letters otherwise (U+0130), so compare in SQL.
- An address mail is sent from or to as given in a request (an email's
  ``from``, ``to``, ``cc``, ``bcc``, ``reply_to``; a template's or a
  broadcast's sender and reply-to: ``parse_address`` and ``parse_mailbox``)
  needs an ASCII local part: only SMTPUTF8 (RFC 6531) carries another, and
  Tidings cannot count on its relay offering it. An
  internationalised domain is fine: it goes out in its xn-- form
  (``wire_address``). Contacts and suppressions take any valid address.

A refusal is a ``FieldError`` naming the field and the reason.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from email import errors as email_errors
from email.headerregistry import HeaderRegistry
from email.utils import getaddresses

import email_validator
import idna

from tidings.fields import FieldError
from tidings.rendering_variables import CONTROL_CHARACTERS

# A JSON schema maxLength for an address field; the octet limits below decide.
MAX_ADDRESS_LENGTH = 320
MAX_LOCAL_OCTETS = 64
MAX_ADDRESS_OCTETS = 254

BARE_ONLY = "must be one email address, without a display name or comment"
MAILBOX_FORM = "must be an email address, optionally with a display name: 'Name <address>'"
NOT_SENDABLE = (
    "the part before the @ has characters outside ASCII ({chars}), which only SMTPUTF8 "
    "(RFC 6531) can carry, and Tidings cannot count on it: refused here rather than "
    "failed when sent (an internationalised domain is fine)"
)

# A bare address with nothing a display name, quoting or a comment would
# need: what the header parser would give back unchanged.
BARE_ADDRESS = re.compile(r"[^\s<>()\"\\,;:\[\]]+@[^\s<>()\"\\,;:\[\]]+")

# The address forms email-validator accepts without further thought: an ASCII
# dot-atom before the @ and a host name after it. For these only the domain
# needs email-validator's full check, and a domain is checked once per
# process (an import of 50,000 rows usually names a few dozen domains).
_ATEXT = r"A-Za-z0-9_!#$%&'*+\-/=?^`{|}~"
_PLAIN_ADDRESS = re.compile(rf"([{_ATEXT}]+(?:\.[{_ATEXT}]+)*)@([A-Za-z0-9.\-]+)")
# Local parts that email-validator lowercases (RFC 2142); they take the full path.
_CASELESS_MAILBOXES = frozenset(email_validator.rfc_constants.CASE_INSENSITIVE_MAILBOX_NAMES)

_HEADERS = HeaderRegistry()
# Characters of Unicode's private use area: one a mailbox lacks stands in for
# ``=?`` while the header parser reads it (a mailbox is far shorter than 6,400).
_STAND_INS = [chr(code) for code in range(0xE000, 0xF900)]
# A display name with one of these is quoted (RFC 5322 specials, as formataddr has them).
_SPECIALS = re.compile(r'[][\\()<>@,:;".]')
_ESCAPED = re.compile(r'[\\"]')


def display(name: str | None, address: str) -> str:
    """``Name <address>`` as the API shows and stores a mailbox: the name as
    given (quoted when it holds a special character), the address as
    normalised, an internationalised domain in its Unicode form; the bare
    address when there is no name. ``tidings.email.mime`` writes the header
    from it (the name RFC 2047-encoded, the domain in its xn-- form)."""
    if not name:
        return address
    if _SPECIALS.search(name) or name != " ".join(name.split()):
        # A special character, or spaces that an unquoted name would lose
        # (at either end, or several in a row): the name is quoted.
        name = '"' + _ESCAPED.sub(r"\\\g<0>", name) + '"'
    return f"{name} <{address}>"


def shown_parts(shown: Sequence[str]) -> list[tuple[str, str]]:
    """The (name, address) pairs of mailboxes as ``display`` shows them, as
    the header parser gives them (``email.utils.getaddresses``): a bare
    address is its own, with no name; one with a name is parsed once per
    process (a sender's is on every email of its domain)."""
    return [
        pair for one in shown
        for pair in ((("", one),) if BARE_ADDRESS.fullmatch(one) else _shown_parts(one))
    ]


@functools.lru_cache(maxsize=1024)
def _shown_parts(one: str) -> tuple[tuple[str, str], ...]:
    return tuple(getaddresses([one]))


@dataclass(frozen=True)
class Mailbox:
    """An address and the display name that goes with it (None: none given)."""

    name: str | None
    address: str

    @property
    def formatted(self) -> str:
        """``Name <address>``, or the address: ``display``."""
        return display(self.name, self.address)


@functools.lru_cache(maxsize=4096)
def _ascii_domain(domain: str) -> str:
    try:
        return idna.encode(domain, uts46=True).decode("ascii")
    except (idna.IDNAError, UnicodeError):
        return domain


def wire_address(address: str) -> str:
    """The address as the SMTP envelope and the headers carry it: the domain
    in its ASCII (xn--) form, IDNA 2008 with UTS #46 as email-validator
    checks it. Never raises: a domain without an ASCII form, or a local part
    outside ASCII, stays as it is, and only SMTPUTF8 can carry it."""
    local, at, domain = address.rpartition("@")
    if not at or domain.isascii():
        return address
    return f"{local}@{_ascii_domain(domain)}"


def check_sendable(address: str, field: str) -> str:
    """``address`` (normalised) if mail can be sent to or from it: an ASCII
    local part; FieldError naming ``field`` otherwise."""
    local = address.rpartition("@")[0]
    if local.isascii():
        return address
    chars = "".join(dict.fromkeys(c for c in local if not c.isascii()))
    raise FieldError(field, NOT_SENDABLE.format(chars=chars))


@functools.lru_cache(maxsize=4096)
def _normalized_domain(domain: str) -> str | None:
    try:
        checked = email_validator.validate_email("a@" + domain, check_deliverability=False)
    except email_validator.EmailNotValidError:
        return None
    return str(checked.domain)


def _octets(text: str) -> int:
    return len(text.encode("utf-8"))


def normalize_address(text: str, field: str = "email") -> str:
    """``text`` as one normalised bare address; FieldError with the reason otherwise.

    The reason is email-validator's, or the RFC 5321 limit that is exceeded.
    """
    value = text.strip()
    if len(value) > MAX_ADDRESS_LENGTH:
        raise FieldError(field, f"longer than {MAX_ADDRESS_LENGTH} characters")
    plain = _PLAIN_ADDRESS.fullmatch(value)
    if plain is not None and len(value) <= MAX_ADDRESS_OCTETS:
        local, domain = plain.groups()
        if local.lower() not in _CASELESS_MAILBOXES:
            normalized_domain = _normalized_domain(domain)
            if normalized_domain is not None:
                _check_limits(local, f"{local}@{normalized_domain}", field)
                return f"{local}@{normalized_domain}"
    try:
        checked = email_validator.validate_email(value, check_deliverability=False)
    except email_validator.EmailNotValidError as error:
        raise FieldError(field, str(error)) from None
    normalized = str(checked.normalized)
    _check_limits(str(checked.local_part), normalized, field)
    return normalized


def lookup_address(value: str) -> str:
    """An address given to find what was stored with it (a contact, an email's
    recipient), normalised as stored ones are (``normalize_address``: Unicode
    NFC, an internationalised domain in its Unicode form), so that every
    spelling of it matches; PostgreSQL's ``lower()`` then ignores case. A value
    that is not an address is kept as given (stripped): it matches nothing."""
    try:
        return normalize_address(value)
    except FieldError:
        return value.strip()


def _check_limits(local: str, address: str, field: str) -> None:
    local_octets = _octets(local)
    if local_octets > MAX_LOCAL_OCTETS:
        raise FieldError(
            field,
            f"the part before the @ is {local_octets} octets long; "
            f"at most {MAX_LOCAL_OCTETS} are allowed (RFC 5321)",
        )
    address_octets = _octets(address)
    if address_octets > MAX_ADDRESS_OCTETS:
        raise FieldError(
            field,
            f"the address is {address_octets} octets long; "
            f"at most {MAX_ADDRESS_OCTETS} are allowed (RFC 5321)",
        )


def parse_address(text: str, field: str) -> str:
    """One bare address to send to or from, normalised. A display name or a
    comment is refused, since only the address would be kept, and so is a
    local part outside ASCII: FieldError naming ``field``."""
    try:
        address = normalize_address(text, field)
    except FieldError as error:
        raise FieldError(field, f"{BARE_ONLY}: {error.reason}") from None
    return check_sendable(address, field)


def parse_mailbox(text: str, field: str = "from") -> Mailbox:
    """An address to send to or from, with an optional display name: ``Name <a@b>``,
    ``"N, Inc." <a@b>`` or ``a@b``. Comments in parentheses, groups, several
    addresses, control characters and a local part outside ASCII are refused
    (FieldError naming ``field``)."""
    return _parse_mailbox(text, field)


# The standard library's header parser costs about 100 µs a mailbox, and a
# team sends from the same few senders again and again: results are kept
# (a refusal is not, and is worked out again each time).
@functools.lru_cache(maxsize=4096)
def _parse_mailbox(text: str, field: str) -> Mailbox:
    # The characters a subject or a header's value refuses, and the tab.
    if "\t" in text or CONTROL_CHARACTERS.search(text):
        raise FieldError(field, f"{MAILBOX_FORM}; control characters are not allowed")
    if has_comment(text):
        # The parser would drop a comment silently, or it would have to be
        # guessed whether "(Acme)" is meant as the name: a name goes first.
        raise FieldError(
            field,
            f"{MAILBOX_FORM}; comments in parentheses are not allowed "
            "(a display name goes before the address)",
        )
    # The parser decodes RFC 2047 encoded words in a display name
    # (``=?utf-8?b?QWRtaW4=?=`` would become ``Admin``) and refuses one in
    # quotes; a name is kept as given, and written encoded by
    # ``tidings.email.mime`` so that a mail client shows it so too. Every
    # ``=?`` is hidden from the parser behind a character the text lacks
    # (``=`` and ``?`` are atext and qtext alike, as is the stand-in).
    stand_in = next(c for c in _STAND_INS if c not in text) if "=?" in text else ""
    try:
        header = _HEADERS("From", text.replace("=?", stand_in) if stand_in else text)
        groups = header.groups  # type: ignore[attr-defined]
        addresses = header.addresses  # type: ignore[attr-defined]
    except Exception:
        # On some malformed input the standard library's parser fails with
        # internal errors (AttributeError, UnboundLocalError...) instead of
        # reporting a defect: all of them mean the value is not an address.
        raise FieldError(field, MAILBOX_FORM) from None
    invalid = [d for d in header.defects if isinstance(d, email_errors.InvalidHeaderDefect)]
    if invalid or len(addresses) != 1 or groups[0].display_name is not None:
        raise FieldError(field, MAILBOX_FORM)
    address = addresses[0]
    addr_spec, name = address.addr_spec, address.display_name
    if stand_in:
        addr_spec, name = addr_spec.replace(stand_in, "=?"), name.replace(stand_in, "=?")
    normalized = check_sendable(normalize_address(addr_spec, field), field)
    return Mailbox(name or None, normalized)


def has_comment(value: str) -> bool:
    """Whether ``value`` holds an RFC 5322 comment: a parenthesis outside a quoted string."""
    quoted = escaped = False
    for char in value:
        if escaped:
            escaped = False
        elif quoted and char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char in "()" and not quoted:
            return True
    return False


def _items(value: object, field: str, limit: int) -> list[tuple[str, str]]:
    """(field of the item, text) for a string or a list of strings."""
    if isinstance(value, str):
        return [(field, value)]
    if not isinstance(value, Sequence):
        raise FieldError(field, "must be an email address or a list of them")
    if not value:
        raise FieldError(field, "must name at least one address")
    if len(value) > limit:
        raise FieldError(field, f"at most {limit} addresses, not {len(value)}")
    items = []
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise FieldError(f"{field}.{index}", "must be a string")
        items.append((f"{field}.{index}", item))
    return items


def parse_address_list(value: str | Sequence[str], field: str, limit: int) -> list[str]:
    """Bare addresses (``to``, ``cc``, ``bcc``, ``reply_to``): one string, or a list
    of 1 to ``limit``; each normalised, in the order given, repeats kept. An
    item is named ``<field>.<index>`` when it is refused."""
    return [parse_address(text, name) for name, text in _items(value, field, limit)]


def parse_mailbox_list(value: str | Sequence[str], field: str, limit: int) -> list[Mailbox]:
    """As ``parse_address_list``, each item with an optional display name."""
    return [parse_mailbox(text, name) for name, text in _items(value, field, limit)]
