"""Settings, read once from the environment. Every name is documented in the README."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from tidings.config_values import (
    LOG_FORMATS,
    LOG_LEVELS,
    MAX_POOL_SIZE,
    MIN_POOL_SIZE,
    QuotaDefaults,
    SettingError,
    SmtpUrl,
    StartTls,
    _bool,
    _choice,
    _database_url,
    _float,
    _host,
    _http_url,
    _int,
    _nameservers,
    _rate,
    _schedule,
    _secret_key,
    _smtp_url,
    parse_smtp_url,
)

__all__ = [
    "Config", "QuotaDefaults", "SettingError", "SmtpUrl", "StartTls", "parse_smtp_url",
    "EMAIL_PROVIDERS", "SMS_PROVIDERS", "DEFAULT_SMS_HELP_TEXT", "LOG_LEVELS", "LOG_FORMATS",
]

EMAIL_PROVIDERS = ("sandbox", "smtp")
DEFAULT_SMS_HELP_TEXT = (
    "{team}: reply STOP to stop these messages, START to get them again. "
    "Msg & data rates may apply."
)
SMS_PROVIDERS = ("sandbox", "twilio")


# An SMS's lease is not renewed while its send waits on the provider: a send
# is given up after half the lease (its message then ``unknown``, never sent
# again), so at least 10 s, within which Twilio answers in any healthy
# moment; a lease that ran out first would let another process take the
# message up (it would find the send begun and not send it again).
SMS_LEASE_MINIMUM_SECONDS = 20.0


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
    # Client connections open at once; None: the open-file limit less a
    # reserve (tidings.http.lean_connections.default_max_connections).
    max_connections: int | None = None

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
    # How often a sender ID the SMS provider could not be asked about is asked again.
    sender_id_review_seconds: float = 300.0
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
    broadcast_connections: int = 2

    # Seconds between the attempts of an SMS the provider did not take (429, 5xx).
    sms_retry_schedule: tuple[float, ...] = (5, 30, 120, 600, 1800)
    # SMS sends in flight at once per team, per process.
    sms_concurrency: int = 16
    # How long a claimed SMS is this process's before another may take it.
    sms_lease_seconds: float = 60.0
    # How often each process looks for due SMS it was not told about.
    sms_poll_seconds: float = 1.0
    # The answer to an inbound HELP or INFO; {team} is the team's name.
    sms_help_text: str = DEFAULT_SMS_HELP_TEXT

    # After SIGTERM: how long requests in flight may take to finish (and
    # then, at most as long again, the actors their current message).
    shutdown_grace_seconds: float = 30.0
    log_level: str = "INFO"
    log_format: str = "text"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        env = os.environ if env is None else env
        return _check_providers(cls(
            database_url=_database_url(env),
            data_dir=Path(env.get("TIDINGS_DATA_DIR") or ".tidings"),
            db_pool_size=_int(
                env, "TIDINGS_DB_POOL_SIZE", 10, minimum=MIN_POOL_SIZE, maximum=MAX_POOL_SIZE
            ),
            max_body_bytes=_int(env, "TIDINGS_MAX_BODY_BYTES", 1024 * 1024, minimum=1024),
            import_max_body_bytes=_int(
                env, "TIDINGS_IMPORT_MAX_BODY_BYTES", 32 * 1024 * 1024, minimum=1024
            ),
            rate_limit_per_second=_rate(env, "TIDINGS_RATE_LIMIT_PER_SECOND", 100.0),
            rate_limit_burst=_int(env, "TIDINGS_RATE_LIMIT_BURST", 200, minimum=1),
            max_in_flight=_int(env, "TIDINGS_MAX_IN_FLIGHT", 64, minimum=1),
            max_db_waiters=_int(env, "TIDINGS_MAX_DB_WAITERS", 10, minimum=0),
            # Unset (0, never a valid value): worked out when serving.
            max_connections=_int(env, "TIDINGS_MAX_CONNECTIONS", 0, minimum=1) or None,
            idempotency_retention_seconds=_int(
                env, "IDEMPOTENCY_RETENTION_SECONDS", 86400, minimum=1
            ),
            idempotency_lock_seconds=_int(env, "IDEMPOTENCY_LOCK_SECONDS", 30, minimum=1),
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
            secret_key=_secret_key(env, "TIDINGS_SECRET_KEY"),
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
            email_provider=_choice(env, "TIDINGS_EMAIL_PROVIDER", "sandbox", EMAIL_PROVIDERS),
            sms_provider=_choice(env, "TIDINGS_SMS_PROVIDER", "sandbox", SMS_PROVIDERS),
            smtp_url=_smtp_url(env, "TIDINGS_SMTP_URL"),
            dns_nameservers=_nameservers(env, "TIDINGS_DNS_NAMESERVERS"),
            twilio_account_sid=(env.get("TWILIO_ACCOUNT_SID") or "").strip() or None,
            twilio_auth_token=(env.get("TWILIO_AUTH_TOKEN") or "").strip() or None,
            twilio_api_url=_http_url(env, "TIDINGS_TWILIO_API_URL", "https://api.twilio.com"),
            public_url=_http_url(env, "TIDINGS_PUBLIC_URL", "http://127.0.0.1:8080"),
            mail_host=_host(env, "TIDINGS_MAIL_HOST", "localhost"),
            domain_recheck_seconds=_float(
                env, "TIDINGS_DOMAIN_RECHECK_SECONDS", 3600.0, minimum=1
            ),
            sender_id_review_seconds=_float(
                env, "TIDINGS_SENDER_ID_REVIEW_SECONDS", 300.0, minimum=0.1
            ),
            email_retry_schedule=_schedule(
                env, "TIDINGS_EMAIL_RETRY_SCHEDULE", (30, 120, 600, 1800, 3600, 7200)
            ),
            email_concurrency=_int(env, "TIDINGS_EMAIL_CONCURRENCY", 64, minimum=1),
            email_lease_seconds=_float(env, "TIDINGS_EMAIL_LEASE_SECONDS", 60.0, minimum=1),
            email_poll_seconds=_float(env, "TIDINGS_EMAIL_POLL_SECONDS", 1.0, minimum=0.05),
            broadcast_batch_size=_int(env, "TIDINGS_BROADCAST_BATCH_SIZE", 2000, minimum=1),
            broadcast_lease_seconds=_float(env, "TIDINGS_BROADCAST_LEASE_SECONDS", 30, minimum=1),
            broadcast_connections=_int(env, "TIDINGS_BROADCAST_CONNECTIONS", 2, minimum=1),
            smtp_connections=_int(env, "TIDINGS_SMTP_CONNECTIONS", 8, minimum=1),
            reports_secret=(env.get("TIDINGS_REPORTS_SECRET") or "").strip() or None,
            sms_retry_schedule=_schedule(
                env, "TIDINGS_SMS_RETRY_SCHEDULE", (5, 30, 120, 600, 1800)
            ),
            sms_concurrency=_int(env, "TIDINGS_SMS_CONCURRENCY", 16, minimum=1),
            sms_lease_seconds=_float(env, "TIDINGS_SMS_LEASE_SECONDS", 60.0,
                                     minimum=SMS_LEASE_MINIMUM_SECONDS),
            sms_poll_seconds=_float(env, "TIDINGS_SMS_POLL_SECONDS", 1.0, minimum=0.05),
            sms_help_text=(env.get("TIDINGS_SMS_HELP_TEXT") or "").strip() or DEFAULT_SMS_HELP_TEXT,
            quotas=QuotaDefaults.from_env(env),
            shutdown_grace_seconds=_float(
                env, "TIDINGS_SHUTDOWN_GRACE_SECONDS", 30.0, minimum=0.1
            ),
            log_level=_choice(env, "TIDINGS_LOG_LEVEL", "INFO", LOG_LEVELS),
            log_format=_choice(env, "TIDINGS_LOG_FORMAT", "text", LOG_FORMATS),
        ))

    def with_(self, **changes: object) -> Config:
        return replace(self, **changes)  # type: ignore[arg-type]


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
