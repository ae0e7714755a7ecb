"""How the text of each setting becomes a value: numbers, choices, URLs, hosts,
keys and the quota defaults, each refused with a SettingError that names the
setting and says what it must be. ``tidings.config`` reads them into Config."""

from __future__ import annotations

import base64
import binascii
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from tidings.email.names import domain_name

StartTls = Literal["require", "auto", "off"]


class SettingError(ValueError):
    """A setting has a value Tidings cannot use."""


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingError(f"{name} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise SettingError(f"{name} must be at least {minimum}, not {value}")
    return value


def _float(env: Mapping[str, str], name: str, default: float, minimum: float = 0) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingError(f"{name} must be a number, not {raw!r}") from None
    if value < minimum:
        raise SettingError(f"{name} must be at least {minimum}, not {value}")
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
    try:
        values = tuple(float(part) for part in raw.split(","))
    except ValueError:
        raise SettingError(f"{name} must be comma-separated seconds, not {raw!r}") from None
    if not values or any(v < 0 for v in values):
        raise SettingError(f"{name} must list one or more non-negative seconds")
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


def _database_url(env: Mapping[str, str]) -> str | None:
    raw = (env.get("DATABASE_URL") or "").strip()
    if not raw:
        return None
    scheme = raw.partition("://")[0].lower() if "://" in raw else ""
    if scheme not in ("postgresql", "postgres"):
        raise SettingError(
            "DATABASE_URL must be a postgresql://user:password@host:port/database URL, "
            f"not {scheme + '://...' if scheme else repr(raw[:40])}"
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


def parse_smtp_url(raw: str, name: str = "TIDINGS_SMTP_URL") -> SmtpUrl:
    shape = "smtp://[user:password@]host[:port][?starttls=require|auto|off] or smtps://..."
    parts = urlsplit(raw.strip())
    if parts.scheme not in ("smtp", "smtps") or not parts.hostname:
        raise SettingError(f"{name} must look like {shape}, not {raw!r}")
    try:
        port = parts.port
    except ValueError:
        raise SettingError(f"{name} has a bad port: {raw!r}") from None
    if parts.path not in ("", "/") or parts.fragment:
        raise SettingError(f"{name} must not have a path or fragment: {raw!r}")
    implicit = parts.scheme == "smtps"
    starttls: StartTls = "off" if implicit else "auto"
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key != "starttls":
            raise SettingError(f"{name}: unknown parameter {key!r}; only starttls is known")
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
    parts = urlsplit(raw)
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise SettingError(f"{name} has a bad port: {raw!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingError(f"{name} must be an http:// or https:// URL, not {raw!r}")
    if parts.query or parts.fragment:
        raise SettingError(f"{name} must not have a query or fragment: {raw!r}")
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
            emails_per_day=_int(env, "TIDINGS_QUOTA_EMAILS_PER_DAY", 0),
            emails_per_month=_int(env, "TIDINGS_QUOTA_EMAILS_PER_MONTH", 0),
            sms_per_day=_int(env, "TIDINGS_QUOTA_SMS_PER_DAY", 0),
            sms_per_month=_int(env, "TIDINGS_QUOTA_SMS_PER_MONTH", 0),
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
