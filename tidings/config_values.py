"""How the text of each setting becomes a value: numbers, choices, URLs, hosts,
keys and the quota defaults, each refused with a SettingError that names the
setting and says what it must be. ``tidings.config`` reads them into Config."""

from __future__ import annotations

import base64
import binascii
import ipaddress
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import SplitResult, parse_qs, parse_qsl, unquote, urlsplit

import idna

from tidings.email.names import domain_name

StartTls = Literal["require", "auto", "off"]

# The most a number setting may be: PostgreSQL's integer for counts and sizes;
# for seconds, a century, which every interval and timestamp it is added to holds.
MAX_INT = 2**31 - 1
MAX_SECONDS = 100 * 365 * 86400
# PostgreSQL's bigint: the quota columns.
MAX_BIGINT = 2**63 - 1
# A label of a host name in a URL (underscores too: container and service names).
HOST_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
# Numbers as written in a configuration file: ASCII digits only. Python's
# int() and float() also take other scripts' digits (``١٠``) and
# underscores (``1_0``), which no one means in a setting.
INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*", re.ASCII)
NUMBER = re.compile(r"\s*[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*", re.ASCII)


class SettingError(ValueError):
    """A setting has a value Tidings cannot use."""


def _int(
    env: Mapping[str, str], name: str, default: int, minimum: int = 0, maximum: int = MAX_INT
) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    if not INTEGER.fullmatch(raw):
        raise SettingError(f"{name} must be an integer, not {raw!r}")
    value = int(raw)
    if value < minimum:
        raise SettingError(f"{name} must be at least {minimum}, not {value}")
    if value > maximum:
        raise SettingError(f"{name} must be at most {maximum}, not {raw.strip()!r}")
    return value


# A pool of the storage connections: asyncpg allocates for its whole maximum
# at start, so a size far above any server's connection limit is refused
# rather than left to fill the memory.
MIN_POOL_SIZE = 2
MAX_POOL_SIZE = 1000
# The slowest request rate a token can be held to (0 is no limit): below it,
# Retry-After would be days.
MIN_RATE_PER_SECOND = 0.01


def _rate(env: Mapping[str, str], name: str, default: float) -> float:
    """A rate in requests per second: 0 (no limit) or at least MIN_RATE_PER_SECOND."""
    value = _float(env, name, default, maximum=MAX_INT)
    if 0 < value < MIN_RATE_PER_SECOND:
        raise SettingError(
            f"{name} must be 0 (no limit) or at least {MIN_RATE_PER_SECOND}, not {value:g}"
        )
    return value


def _float(
    env: Mapping[str, str],
    name: str,
    default: float,
    minimum: float = 0,
    maximum: float = MAX_SECONDS,
) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    if raw.strip().lower().lstrip("+-") in ("inf", "infinity", "nan"):
        raise SettingError(f"{name} must be a finite number, not {raw!r}")
    if not NUMBER.fullmatch(raw):
        raise SettingError(f"{name} must be a number, not {raw!r}")
    value = float(raw)
    if not math.isfinite(value):  # 1e999
        raise SettingError(f"{name} must be a finite number, not {raw!r}")
    if value < minimum:
        raise SettingError(f"{name} must be at least {minimum}, not {value}")
    if value > maximum:
        raise SettingError(f"{name} must be at most {maximum:.15g}, not {raw.strip()!r}")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise SettingError(f"{name} must be true or false, not {raw!r}")


def _schedule(env: Mapping[str, str], name: str, default: tuple[float, ...]) -> tuple[float, ...]:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    parts = raw.split(",")
    if not all(NUMBER.fullmatch(part) for part in parts):
        raise SettingError(f"{name} must be comma-separated seconds, not {raw!r}")
    values = tuple(float(part) for part in parts)
    if not values or not all(0 <= v <= MAX_SECONDS for v in values):
        raise SettingError(
            f"{name} must list one or more seconds from 0 to {MAX_SECONDS}, not {raw!r}"
        )
    return values


def _host(env: Mapping[str, str], name: str, default: str) -> str:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    host = raw.strip().lower().removesuffix(".")
    if host != "localhost":
        try:
            host = domain_name(host)
        except ValueError as error:
            raise SettingError(f"{name} must be a host name, not {raw!r}: {error}") from None
    return host


def _choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip()
    if value.lower() not in {choice.lower() for choice in choices}:
        raise SettingError(f"{name} must be one of {', '.join(choices)}, not {raw!r}")
    return next(choice for choice in choices if choice.lower() == value.lower())


def shown_url(raw: str) -> str:
    """``raw`` as a message may show it: a password (``user:password@``, or a
    ``password``/``sslpassword`` parameter) becomes ``***``. Works on any text,
    URL or not. Messages about a URL show this and never a piece split out of
    it: a password with an unencoded ``/``, ``?`` or ``#`` is split wrongly,
    and its pieces would show as a port, a host or a parameter."""
    scheme, separator, rest = raw.partition("://")
    if not separator:
        scheme, rest = "", raw
    userinfo, at, after = rest.rpartition("@")
    if at and ":" in userinfo:
        rest = f"{userinfo.partition(':')[0]}:***@{after}"
    rest = re.sub(r"(?i)(password=)[^&#]*", r"\1***", rest)
    return f"{scheme}{separator}{rest}"


def _port(text: str) -> int | None:
    """A URL's port, 1 to 65535; None when the text is not one."""
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        return None
    return int(text)


def _database_url(env: Mapping[str, str]) -> str | None:
    raw = (env.get("DATABASE_URL") or "").strip()
    if not raw:
        return None
    scheme = raw.partition("://")[0].lower() if "://" in raw else ""
    if scheme not in ("postgresql", "postgres"):
        raise SettingError(
            "DATABASE_URL must be a postgresql://user:password@host:port/database URL, "
            f"not {scheme + '://...' if scheme else repr(shown_url(raw)[:40])}"
        )
    try:
        parts = urlsplit(raw)
        query = parse_qs(parts.query, strict_parsing=True) if parts.query else {}
    except ValueError:
        raise SettingError(f"DATABASE_URL is not a URL: {shown_url(raw)!r}") from None
    # The host list as asyncpg reads it: host[:port] or [ipv6][:port], comma-separated.
    hosts = parts.netloc.partition("@")[2] if "@" in parts.netloc else parts.netloc
    ports = [p for values in query.get("port", []) for p in values.split(",")]
    for spec in hosts.split(",") if hosts else []:
        if spec.startswith("["):
            found = re.match(r"\[[^\]]+\](?::(.*))?$", spec)
            if found is None:
                raise SettingError(f"DATABASE_URL has a bad host: {shown_url(raw)!r}")
            ports.append(unquote(found.group(1) or ""))
        elif not spec:
            raise SettingError(f"DATABASE_URL has an empty host in {shown_url(raw)!r}")
        elif not spec.startswith("/"):
            ports.append(unquote(spec.partition(":")[2]))
    for text in ports:
        if text and _port(text) is None:
            raise SettingError(
                f"DATABASE_URL has a bad port (1 to 65535): {shown_url(raw)!r} (a password "
                "with @ : / ? # is written percent-encoded: %40 %3A %2F %3F %23)"
            )
    return raw


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("text", "json")


@dataclass(frozen=True)
class SmtpUrl:
    """``TIDINGS_SMTP_URL``: ``smtp://[user:password@]host[:port][?starttls=...]`` or
    ``smtps://`` (TLS from the first byte). ``starttls``: ``require`` (refuse a
    server that does not offer it), ``auto`` (use it when offered; the default)
    or ``off``; always ``off`` with smtps."""

    host: str
    port: int
    implicit_tls: bool
    starttls: StartTls
    username: str | None = None
    password: str | None = field(default=None, repr=False)


def _split_url(raw: str, name: str) -> tuple[SplitResult, int | None]:
    """A URL setting's parts and port; its host, when it has one, is an IP
    address or a host name. Messages never show the URL's password."""
    shown = shown_url(raw)
    if any(char.isspace() or not char.isprintable() for char in raw):
        raise SettingError(f"{name} must not contain spaces or control characters: {shown!r}")
    try:
        parts = urlsplit(raw)
    except ValueError:
        raise SettingError(f"{name} is not a URL: {shown!r}") from None
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise SettingError(f"{name} has a bad port: {shown!r}")
    hostname = parts.hostname
    if hostname and not _url_host(hostname):
        raise SettingError(f"{name} has a bad host name {hostname!r}: {shown!r}")
    return parts, port


def _url_host(hostname: str) -> bool:
    """Whether a URL's host is an IP address or a host name."""
    try:
        ipaddress.ip_address(hostname)
    except ValueError:
        pass
    else:
        return True
    try:
        name = hostname if hostname.isascii() else idna.encode(hostname, uts46=True).decode()
    except UnicodeError:
        return False
    labels = name.removesuffix(".").split(".")
    return len(name) <= 253 and all(HOST_LABEL.match(label) for label in labels)


def parse_smtp_url(raw: str, name: str = "TIDINGS_SMTP_URL") -> SmtpUrl:
    shape = "smtp://[user:password@]host[:port][?starttls=require|auto|off] or smtps://..."
    raw = raw.strip()
    shown = shown_url(raw)
    parts, port = _split_url(raw, name)
    if parts.scheme not in ("smtp", "smtps") or not parts.hostname:
        raise SettingError(f"{name} must look like {shape}, not {shown!r}")
    if parts.path not in ("", "/") or parts.fragment:
        raise SettingError(f"{name} must not have a path or fragment: {shown!r}")
    implicit = parts.scheme == "smtps"
    starttls: StartTls = "off" if implicit else "auto"
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key != "starttls":
            # A parameter of a URL with user info may be a piece of its password.
            which = repr(key) if "@" not in raw else f"in {shown!r}"
            raise SettingError(f"{name}: unknown parameter {which}; only starttls is known")
        if value not in ("require", "auto", "off"):
            raise SettingError(f"{name}: starttls must be require, auto or off, not {value!r}")
        if implicit and value != "off":
            raise SettingError(f"{name}: starttls does not apply to smtps:// (TLS from the start)")
        starttls = value  # type: ignore[assignment]
    return SmtpUrl(
        host=parts.hostname,
        port=port if port is not None else (465 if implicit else 25),
        implicit_tls=implicit,
        starttls=starttls,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
    )


def _smtp_url(env: Mapping[str, str], name: str) -> SmtpUrl | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    return parse_smtp_url(raw, name)


def _nameservers(env: Mapping[str, str], name: str) -> tuple[tuple[str, int], ...]:
    """``ip[:port]`` items, comma-separated; IPv6 with a port as ``[ip]:port``."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return ()
    servers = []
    for item in (part.strip() for part in raw.split(",")):
        host, port_text = item, "53"
        if item.startswith("["):
            host, bracket, rest = item[1:].partition("]")
            if not bracket or (rest and not rest.startswith(":")):
                raise SettingError(f"{name}: {item!r} is not ip[:port]")
            port_text = rest[1:] or "53"
        elif item.count(":") == 1:
            host, _, port_text = item.partition(":")
        try:
            address = ipaddress.ip_address(host)
            port = int(port_text)
        except ValueError:
            raise SettingError(f"{name}: {item!r} is not ip[:port]") from None
        if not 1 <= port <= 65535:
            raise SettingError(f"{name}: {item!r} has a port outside 1..65535")
        servers.append((str(address), port))
    return tuple(servers)


def _http_url(env: Mapping[str, str], name: str, default: str) -> str:
    """An ``http(s)://host[:port][/path]`` base URL, without a trailing slash."""
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    shown = shown_url(raw)
    parts, _ = _split_url(raw, name)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingError(f"{name} must be an http:// or https:// URL, not {shown!r}")
    if parts.query or parts.fragment:
        raise SettingError(f"{name} must not have a query or fragment: {shown!r}")
    return raw.rstrip("/")


@dataclass(frozen=True)
class QuotaDefaults:
    """Every team's limits per UTC day and month unless the team has its own
    (``tidings quotas set``). 0 means unlimited."""

    emails_per_day: int = 0
    emails_per_month: int = 0
    sms_per_day: int = 0
    sms_per_month: int = 0

    def for_channel(self, channel: str) -> tuple[int, int]:
        """The (per day, per month) limits of ``email`` or ``sms``."""
        if channel == "email":
            return self.emails_per_day, self.emails_per_month
        return self.sms_per_day, self.sms_per_month

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> QuotaDefaults:
        return cls(
            emails_per_day=_int(env, "TIDINGS_QUOTA_EMAILS_PER_DAY", 0, maximum=MAX_BIGINT),
            emails_per_month=_int(env, "TIDINGS_QUOTA_EMAILS_PER_MONTH", 0, maximum=MAX_BIGINT),
            sms_per_day=_int(env, "TIDINGS_QUOTA_SMS_PER_DAY", 0, maximum=MAX_BIGINT),
            sms_per_month=_int(env, "TIDINGS_QUOTA_SMS_PER_MONTH", 0, maximum=MAX_BIGINT),
        )


def _secret_key(env: Mapping[str, str], name: str) -> bytes | None:
    """32 bytes given as 64 hex digits or as base64; None when unset."""
    raw = (env.get(name) or "").strip()
    if not raw:
        return None
    try:
        key = bytes.fromhex(raw) if len(raw) == 64 else base64.b64decode(
            raw.replace("-", "+").replace("_", "/") + "=" * (-len(raw) % 4), validate=True
        )
    except (ValueError, binascii.Error):
        key = b""
    if len(key) != 32:
        raise SettingError(
            f"{name} must be 32 bytes as 64 hex digits or base64 "
            "(e.g. the output of: python -c 'import secrets; print(secrets.token_hex(32))')"
        )
    return key
