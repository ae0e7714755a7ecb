"""Settings, read once from the environment. Every name is documented in the README."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from tidings.email.dns import parse_nameservers
from tidings.email.names import domain_name


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


def _nameservers(env: Mapping[str, str], name: str) -> tuple[tuple[str, int], ...]:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return ()
    try:
        return parse_nameservers(raw)
    except ValueError as error:
        raise SettingError(
            f"{name} must be comma-separated ip[:port] items, not {raw!r}: {error}"
        ) from None


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

    idempotency_retention_seconds: int = 86400
    idempotency_lock_seconds: int = 30
    idempotency_shards: int = 16
    idempotency_sweep_seconds: float = 60.0

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

    # Name servers (ip, port) that verify sending domains; () for the system's.
    dns_nameservers: tuple[tuple[str, int], ...] = ()
    # The host that sends and takes delivery reports: the SPF and return-path records name it.
    mail_host: str = "localhost"
    # How often a verified domain's records are looked up again.
    domain_recheck_seconds: float = 3600.0

    shutdown_grace_seconds: float = 5.0
    log_level: str = "INFO"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        env = os.environ if env is None else env
        return cls(
            database_url=env.get("DATABASE_URL") or None,
            data_dir=Path(env.get("TIDINGS_DATA_DIR") or ".tidings"),
            db_pool_size=_int(env, "TIDINGS_DB_POOL_SIZE", 10, minimum=2),
            max_body_bytes=_int(env, "TIDINGS_MAX_BODY_BYTES", 1024 * 1024, minimum=1024),
            import_max_body_bytes=_int(
                env, "TIDINGS_IMPORT_MAX_BODY_BYTES", 32 * 1024 * 1024, minimum=1024
            ),
            rate_limit_per_second=_float(env, "TIDINGS_RATE_LIMIT_PER_SECOND", 100.0),
            rate_limit_burst=_int(env, "TIDINGS_RATE_LIMIT_BURST", 200, minimum=1),
            idempotency_retention_seconds=_int(
                env, "IDEMPOTENCY_RETENTION_SECONDS", 86400, minimum=1
            ),
            idempotency_lock_seconds=_int(env, "IDEMPOTENCY_LOCK_SECONDS", 30, minimum=1),
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
            email_provider=env.get("TIDINGS_EMAIL_PROVIDER") or "sandbox",
            sms_provider=env.get("TIDINGS_SMS_PROVIDER") or "sandbox",
            dns_nameservers=_nameservers(env, "TIDINGS_DNS_NAMESERVERS"),
            mail_host=_host(env, "TIDINGS_MAIL_HOST", "localhost"),
            domain_recheck_seconds=_float(
                env, "TIDINGS_DOMAIN_RECHECK_SECONDS", 3600.0, minimum=1
            ),
            log_level=(env.get("TIDINGS_LOG_LEVEL") or "INFO").upper(),
        )

    def with_(self, **changes: object) -> Config:
        return replace(self, **changes)  # type: ignore[arg-type]
