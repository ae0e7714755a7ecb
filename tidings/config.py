"""Settings, read once from the environment. Every name is documented in the README."""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from tidings.email.names import domain_name

EMAIL_PROVIDERS = ("sandbox", "smtp")
SMS_PROVIDERS = ("sandbox", "twilio")
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


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    raw = (env.get(name) or "").strip()
    if not raw:
        return choices[0]
    if raw.lower() not in choices:
        raise SettingError(f"{name} must be one of {', '.join(choices)}, not {raw!r}")
    return raw.lower()


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


def _check_providers(config: Config) -> Config:
    """The chosen providers have what they need."""
    if config.email_provider == "smtp" and config.smtp_url is None:
        raise SettingError("TIDINGS_EMAIL_PROVIDER=smtp needs TIDINGS_SMTP_URL")
    if config.sms_provider == "twilio":
        missing = [
            name
            for name, value in (
                ("TWILIO_ACCOUNT_SID", config.twilio_account_sid),
                ("TWILIO_AUTH_TOKEN", config.twilio_auth_token),
            )
            if not value
        ]
        if missing:
            raise SettingError(f"TIDINGS_SMS_PROVIDER=twilio needs {' and '.join(missing)}")
    return config
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


@dataclass(frozen=True)
class Config:
    """Everything the service reads from its environment."""

    database_url: str | None = None
    data_dir: Path = Path(".tidings")
    db_pool_size: int = 10

    max_body_bytes: int = 1024 * 1024
    # POST /contacts/import only: 50,000 rows of a typical CSV or JSON fit.
    import_max_body_bytes: int = 32 * 1024 * 1024
    # Per-token requests per second (token bucket); 0 disables the limit.
    rate_limit_per_second: float = 100.0
    rate_limit_burst: int = 200
    # Load shedding (tidings/http/shedding.py): requests handled at once, and
    # requests that may wait for a pooled connection; beyond them, 503.
    max_in_flight: int = 64
    max_db_waiters: int = 10

    idempotency_retention_seconds: int = 86400
    idempotency_lock_seconds: int = 30
    idempotency_shards: int = 16
    # How often the retention sweeper deletes expired idempotency records.
    idempotency_sweep_seconds: float = 60.0
    # Seals stored responses that carry secrets (tidings/sealing.py).
    secret_key: bytes | None = field(default=None, repr=False)

    # Retention: events (with their deliveries) and finished deliveries (with
    # their attempts) older than this are deleted, in batches, every sweep.
    event_retention_seconds: int = 30 * 86400
    webhook_delivery_retention_seconds: int = 30 * 86400
    retention_sweep_seconds: float = 300.0
    retention_batch_size: int = 1000

    webhook_auto_disable_after: int = 20
    webhook_retry_schedule: tuple[float, ...] = (0, 5, 300, 1800, 7200, 18000, 36000, 36000)
    webhook_timeout_seconds: float = 15.0
    webhook_allow_private_urls: bool = False
    # Attempts in flight at once per endpoint, per process.
    webhook_concurrency: int = 8
    # How often each process looks for due deliveries it was not told about.
    webhook_poll_seconds: float = 1.0

    email_provider: str = "sandbox"
    sms_provider: str = "sandbox"
    smtp_url: SmtpUrl | None = None
    # Empty: the system resolver.
    dns_nameservers: tuple[tuple[str, int], ...] = ()
    twilio_account_sid: str | None = None
    twilio_auth_token: str | None = field(default=None, repr=False)
    twilio_api_url: str = "https://api.twilio.com"
    # Unsubscribe links and provider callbacks are built on it.
    public_url: str = "http://127.0.0.1:8080"
    quotas: QuotaDefaults = QuotaDefaults()

    # The host that sends and takes delivery reports: the SPF and return-path records name it.
    mail_host: str = "localhost"
    # How often a verified domain's records are looked up again.
    domain_recheck_seconds: float = 3600.0
    # SMTP connections to TIDINGS_SMTP_URL kept open and used at once, per process.
    smtp_connections: int = 8
    # The bearer secret of POST /providers/smtp/reports; None turns the route off.
    reports_secret: str | None = field(default=None, repr=False)

    # Seconds between the attempts of an email whose recipients were deferred.
    email_retry_schedule: tuple[float, ...] = (30, 120, 600, 1800, 3600, 7200)
    # Sends in flight at once per team, per process.
    email_concurrency: int = 64
    # How long a claimed email is this process's before another may take it.
    email_lease_seconds: float = 60.0
    # How often each process looks for due emails it was not told about.
    email_poll_seconds: float = 1.0
    broadcast_batch_size: int = 2000
    broadcast_lease_seconds: float = 30.0

    shutdown_grace_seconds: float = 5.0
    log_level: str = "INFO"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        env = os.environ if env is None else env
        return _check_providers(cls(
            database_url=env.get("DATABASE_URL") or None,
            data_dir=Path(env.get("TIDINGS_DATA_DIR") or ".tidings"),
            db_pool_size=_int(env, "TIDINGS_DB_POOL_SIZE", 10, minimum=2),
            max_body_bytes=_int(env, "TIDINGS_MAX_BODY_BYTES", 1024 * 1024, minimum=1024),
            import_max_body_bytes=_int(
                env, "TIDINGS_IMPORT_MAX_BODY_BYTES", 32 * 1024 * 1024, minimum=1024
            ),
            rate_limit_per_second=_float(env, "TIDINGS_RATE_LIMIT_PER_SECOND", 100.0),
            rate_limit_burst=_int(env, "TIDINGS_RATE_LIMIT_BURST", 200, minimum=1),
            max_in_flight=_int(env, "TIDINGS_MAX_IN_FLIGHT", 64, minimum=1),
            max_db_waiters=_int(env, "TIDINGS_MAX_DB_WAITERS", 10, minimum=0),
            idempotency_retention_seconds=_int(
                env, "IDEMPOTENCY_RETENTION_SECONDS", 86400, minimum=1
            ),
            idempotency_lock_seconds=_int(env, "IDEMPOTENCY_LOCK_SECONDS", 30, minimum=1),
            secret_key=_secret_key(env, "TIDINGS_SECRET_KEY"),
            event_retention_seconds=_int(
                env, "TIDINGS_EVENT_RETENTION_SECONDS", 30 * 86400, minimum=1
            ),
            webhook_delivery_retention_seconds=_int(
                env, "TIDINGS_WEBHOOK_DELIVERY_RETENTION_SECONDS", 30 * 86400, minimum=1
            ),
            retention_sweep_seconds=_float(
                env, "TIDINGS_RETENTION_SWEEP_SECONDS", 300.0, minimum=1
            ),
            retention_batch_size=_int(env, "TIDINGS_RETENTION_BATCH_SIZE", 1000, minimum=1),
            webhook_auto_disable_after=_int(
                env, "WEBHOOK_DELIVERY_AUTO_DISABLE_AFTER", 20, minimum=1
            ),
            webhook_retry_schedule=_schedule(
                env, "WEBHOOK_RETRY_SCHEDULE", (0, 5, 300, 1800, 7200, 18000, 36000, 36000)
            ),
            webhook_timeout_seconds=_float(env, "WEBHOOK_TIMEOUT_SECONDS", 15.0, minimum=0.1),
            webhook_allow_private_urls=_bool(env, "WEBHOOK_ALLOW_PRIVATE_URLS", False),
            webhook_concurrency=_int(env, "TIDINGS_WEBHOOK_CONCURRENCY", 8, minimum=1),
            webhook_poll_seconds=_float(env, "TIDINGS_WEBHOOK_POLL_SECONDS", 1.0, minimum=0.05),
            email_provider=_choice(env, "TIDINGS_EMAIL_PROVIDER", EMAIL_PROVIDERS),
            sms_provider=_choice(env, "TIDINGS_SMS_PROVIDER", SMS_PROVIDERS),
            smtp_url=_smtp_url(env, "TIDINGS_SMTP_URL"),
            dns_nameservers=_nameservers(env, "TIDINGS_DNS_NAMESERVERS"),
            twilio_account_sid=(env.get("TWILIO_ACCOUNT_SID") or "").strip() or None,
            twilio_auth_token=(env.get("TWILIO_AUTH_TOKEN") or "").strip() or None,
            twilio_api_url=_http_url(env, "TIDINGS_TWILIO_API_URL", "https://api.twilio.com"),
            public_url=_http_url(env, "TIDINGS_PUBLIC_URL", "http://127.0.0.1:8080"),
            quotas=QuotaDefaults.from_env(env),
            mail_host=_host(env, "TIDINGS_MAIL_HOST", "localhost"),
            domain_recheck_seconds=_float(
                env, "TIDINGS_DOMAIN_RECHECK_SECONDS", 3600.0, minimum=1
            ),
            email_retry_schedule=_schedule(
                env, "TIDINGS_EMAIL_RETRY_SCHEDULE", (30, 120, 600, 1800, 3600, 7200)
            ),
            email_concurrency=_int(env, "TIDINGS_EMAIL_CONCURRENCY", 64, minimum=1),
            email_lease_seconds=_float(env, "TIDINGS_EMAIL_LEASE_SECONDS", 60.0, minimum=1),
            email_poll_seconds=_float(env, "TIDINGS_EMAIL_POLL_SECONDS", 1.0, minimum=0.05),
            broadcast_batch_size=_int(env, "TIDINGS_BROADCAST_BATCH_SIZE", 2000, minimum=1),
            broadcast_lease_seconds=_float(env, "TIDINGS_BROADCAST_LEASE_SECONDS", 30, minimum=1),
            smtp_connections=_int(env, "TIDINGS_SMTP_CONNECTIONS", 8, minimum=1),
            reports_secret=(env.get("TIDINGS_REPORTS_SECRET") or "").strip() or None,
            log_level=(env.get("TIDINGS_LOG_LEVEL") or "INFO").upper(),
        ))

    def with_(self, **changes: object) -> Config:
        return replace(self, **changes)  # type: ignore[arg-type]
