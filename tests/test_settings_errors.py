"""Settings and arguments a user gets wrong: each stops the command with one
line that names it (exit status 1), or with argparse's usage error (exit
status 2), never with a traceback or as a database failure; and a setting's
message never shows a password.

The commands that must fail before using a database get one that cannot be
reached, so that checking too late shows as "cannot use the database". They
run in this process (``tidings_in_process``, which never opens a database nor
serves), except the first case of each test and every bad DATABASE_URL: real
subprocesses, end to end.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import trio

from tests.test_cli import (
    COMMANDS,
    Run,
    assert_one_line_failure,
    first_in_a_subprocess,
    tidings,
    tidings_in_process,
)
from tidings.config import SMS_LEASE_MINIMUM_SECONDS, Config, SettingError
from tidings.providers import twilio

UNREACHABLE = "postgresql://127.0.0.1:1/tidings"
PASSWORD = "S3cretPassw0rd"


def assert_usage_error(done: subprocess.CompletedProcess[str], argument: str) -> str:
    """argparse's way: the usage, then one line naming the argument; exit status 2."""
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith("usage: tidings "), lines
    assert f"error: argument {argument}: " in lines[-1], lines
    return lines[-1]


@pytest.mark.parametrize(("run", "port"), first_in_a_subprocess(["70000", "-1", "65536"]))
def test_a_port_outside_0_to_65535_is_a_usage_error(run: Run, port: str, tmp_path: Path) -> None:
    done = run(["serve", "--port", port], tmp_path, DATABASE_URL=UNREACHABLE)
    line = assert_usage_error(done, "--port")
    assert f"must be 0 to 65535, not {port}" in line


URLS = [
    ("TIDINGS_PUBLIC_URL", "http://[::1"),
    ("TIDINGS_TWILIO_API_URL", "https://[::1"),
    ("TIDINGS_SMTP_URL", "smtp://[::1"),
    ("DATABASE_URL", "postgresql://[::1"),
    ("DATABASE_URL", "postgresql://u:p@127.0.0.1:notaport/db"),
    ("DATABASE_URL", "postgresql://127.0.0.1:99999/db"),
    ("DATABASE_URL", "postgresql://127.0.0.1/db?sslmode"),
    ("TIDINGS_PUBLIC_URL", "http://exa mple.com"),
    ("TIDINGS_PUBLIC_URL", "http://exa%20mple.com"),
    ("TIDINGS_TWILIO_API_URL", "https://api..twilio.com"),
    ("TIDINGS_SMTP_URL", "smtp://relay_-.example.com"),
    ("TIDINGS_PUBLIC_URL", "http://example.com:0"),
]


@pytest.mark.parametrize(("run", "name", "url"), first_in_a_subprocess(URLS))
def test_an_unparseable_url_is_one_line_naming_it(
    run: Run, name: str, url: str, tmp_path: Path
) -> None:
    settings = {"DATABASE_URL": UNREACHABLE, name: url}
    assert_one_line_failure(run(COMMANDS["tokens revoke"], tmp_path, **settings), name)


# Every number setting: what a number of it may not be.
FLOATS = [
    "TIDINGS_RATE_LIMIT_PER_SECOND", "TIDINGS_RETENTION_SWEEP_SECONDS",
    "WEBHOOK_TIMEOUT_SECONDS", "TIDINGS_WEBHOOK_POLL_SECONDS",
    "TIDINGS_DOMAIN_RECHECK_SECONDS", "TIDINGS_SENDER_ID_REVIEW_SECONDS",
    "TIDINGS_EMAIL_LEASE_SECONDS", "TIDINGS_EMAIL_POLL_SECONDS",
    "TIDINGS_BROADCAST_LEASE_SECONDS", "TIDINGS_SMS_LEASE_SECONDS", "TIDINGS_SMS_POLL_SECONDS",
    "TIDINGS_SHUTDOWN_GRACE_SECONDS",
]
SCHEDULES = [
    "WEBHOOK_RETRY_SCHEDULE", "TIDINGS_EMAIL_RETRY_SCHEDULE", "TIDINGS_SMS_RETRY_SCHEDULE",
]
INTEGERS = [
    "TIDINGS_DB_POOL_SIZE", "TIDINGS_MAX_BODY_BYTES", "TIDINGS_IMPORT_MAX_BODY_BYTES",
    "TIDINGS_RATE_LIMIT_BURST", "TIDINGS_MAX_IN_FLIGHT", "TIDINGS_MAX_DB_WAITERS",
    "TIDINGS_MAX_CONNECTIONS", "IDEMPOTENCY_RETENTION_SECONDS", "IDEMPOTENCY_LOCK_SECONDS",
    "TIDINGS_EVENT_RETENTION_SECONDS", "TIDINGS_WEBHOOK_DELIVERY_RETENTION_SECONDS",
    "TIDINGS_RETENTION_BATCH_SIZE", "WEBHOOK_DELIVERY_AUTO_DISABLE_AFTER",
    "TIDINGS_WEBHOOK_CONCURRENCY", "TIDINGS_EMAIL_CONCURRENCY", "TIDINGS_BROADCAST_BATCH_SIZE",
    "TIDINGS_BROADCAST_CONNECTIONS", "TIDINGS_SMTP_CONNECTIONS", "TIDINGS_SMS_CONCURRENCY",
    "TIDINGS_QUOTA_EMAILS_PER_DAY", "TIDINGS_QUOTA_EMAILS_PER_MONTH",
    "TIDINGS_QUOTA_SMS_PER_DAY", "TIDINGS_QUOTA_SMS_PER_MONTH",
]
BAD_NUMBERS = [
    *[(name, value) for name in FLOATS for value in ("nan", "NaN", "inf", "-inf", "1e300")],
    *[(name, value) for name in SCHEDULES for value in ("nan", "1,inf", "5,1e300", "-inf")],
    *[(name, "99999999999999999999") for name in INTEGERS],
]


@pytest.mark.parametrize(("name", "value"), BAD_NUMBERS)
def test_a_number_setting_must_be_finite_and_in_range(name: str, value: str) -> None:
    with pytest.raises(SettingError) as refused:
        Config.from_env({name: value})
    assert str(refused.value).startswith(f"{name} must "), str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("value", ["\u0661\u0660", "1_0", "\uff11\uff10", "0x10", "1 0"])
@pytest.mark.parametrize("name", ["TIDINGS_MAX_IN_FLIGHT", "WEBHOOK_TIMEOUT_SECONDS",
                                  "WEBHOOK_RETRY_SCHEDULE"])
def test_a_number_setting_takes_ascii_digits_only(name: str, value: str) -> None:
    """Python reads ``١٠`` (Arabic-Indic) and ``1_0`` as 10; a setting does not."""
    with pytest.raises(SettingError) as refused:
        Config.from_env({name: value})
    assert str(refused.value).startswith(f"{name} must "), str(refused.value)
    assert Config.from_env({"TIDINGS_MAX_IN_FLIGHT": " +10 "}).max_in_flight == 10
    assert Config.from_env({"WEBHOOK_TIMEOUT_SECONDS": ".5"}).webhook_timeout_seconds == 0.5
    assert Config.from_env({"WEBHOOK_TIMEOUT_SECONDS": "1e1"}).webhook_timeout_seconds == 10
    assert Config.from_env({"WEBHOOK_RETRY_SCHEDULE": "0, 2.5,3"}).webhook_retry_schedule == (
        0, 2.5, 3)


@pytest.mark.parametrize(("name", "value"), [
    # asyncpg allocates for a pool's whole maximum at start: 2**31 filled the memory.
    ("TIDINGS_DB_POOL_SIZE", "2147483647"),
    ("TIDINGS_DB_POOL_SIZE", "1001"),
    # A rate this slow would answer a Retry-After of centuries.
    ("TIDINGS_RATE_LIMIT_PER_SECOND", "1e-300"),
    ("TIDINGS_RATE_LIMIT_PER_SECOND", "0.001"),
])
def test_settings_that_would_make_the_service_unusable_are_refused(
    name: str, value: str
) -> None:
    with pytest.raises(SettingError) as refused:
        Config.from_env({name: value})
    assert str(refused.value).startswith(f"{name} must "), str(refused.value)
    assert Config.from_env({"TIDINGS_DB_POOL_SIZE": "1000"}).db_pool_size == 1000
    assert Config.from_env({"TIDINGS_RATE_LIMIT_PER_SECOND": "0"}).rate_limit_per_second == 0


def test_every_number_setting_takes_its_largest_sensible_value() -> None:
    config = Config.from_env({
        "TIDINGS_SHUTDOWN_GRACE_SECONDS": "3153600000",
        "WEBHOOK_RETRY_SCHEDULE": "0,3153600000",
        "TIDINGS_RETENTION_BATCH_SIZE": "2147483647",
        "TIDINGS_QUOTA_SMS_PER_DAY": "9223372036854775807",
    })
    assert config.shutdown_grace_seconds == 3153600000
    assert config.webhook_retry_schedule == (0, 3153600000)
    assert config.retention_batch_size == 2147483647
    assert config.quotas.sms_per_day == 2**63 - 1


@pytest.mark.parametrize(
    ("run", "name", "value"),
    first_in_a_subprocess([
        ("TIDINGS_SHUTDOWN_GRACE_SECONDS", "nan"),
        ("TIDINGS_EMAIL_POLL_SECONDS", "nan"),
        ("WEBHOOK_RETRY_SCHEDULE", "nan"),
        ("TIDINGS_RATE_LIMIT_PER_SECOND", "nan"),
        ("WEBHOOK_TIMEOUT_SECONDS", "nan"),
        ("TIDINGS_EMAIL_LEASE_SECONDS", "1e300"),
        ("TIDINGS_SMS_RETRY_SCHEDULE", "1,inf"),
        ("IDEMPOTENCY_RETENTION_SECONDS", "99999999999999999999"),
    ]),
)
def test_a_number_setting_out_of_range_is_one_line_naming_it(
    run: Run, name: str, value: str, tmp_path: Path
) -> None:
    settings = {"DATABASE_URL": UNREACHABLE, name: value}
    assert_one_line_failure(run(COMMANDS["serve"], tmp_path, **settings), name)


@pytest.mark.parametrize(
    ("run", "name", "url"),
    first_in_a_subprocess([
        ("TIDINGS_SMTP_URL", f"smtp://mailer:{PASSWORD}@relay.example.com:99999"),
        ("TIDINGS_SMTP_URL", f"smtp://mailer:{PASSWORD}@[::1"),
        ("TIDINGS_SMTP_URL", f"ftp://mailer:{PASSWORD}@relay.example.com"),
        ("TIDINGS_SMTP_URL", f"smtp://mailer:{PASSWORD}@relay.example.com/path"),
        ("TIDINGS_PUBLIC_URL", f"https://admin:{PASSWORD}@tidings.example.com?a=1"),
        ("TIDINGS_TWILIO_API_URL", f"https://ac:{PASSWORD}@bad host"),
        ("DATABASE_URL", f"postgresql://app:{PASSWORD}@127.0.0.1:1,/tidings"),
        ("DATABASE_URL", f"postgresql://app:{PASSWORD}@[::1"),
        ("DATABASE_URL", f"app:{PASSWORD}@127.0.0.1/tidings"),
        # A URL that is fine: the command fails at the database.
        ("DATABASE_URL", f"postgresql://app@127.0.0.1:1/tidings?password={PASSWORD}"),
    ]),
)
def test_a_url_setting_message_never_shows_the_password(
    run: Run, name: str, url: str, tmp_path: Path
) -> None:
    settings = {"DATABASE_URL": UNREACHABLE, name: url}
    done = run(COMMANDS["serve"], tmp_path, **settings)
    line = assert_one_line_failure(done, name)
    assert PASSWORD not in done.stderr + done.stdout, line


@pytest.mark.parametrize("separator", ["/", "?", "#"])
@pytest.mark.parametrize(
    ("run", "name", "template"),
    first_in_a_subprocess([
        ("DATABASE_URL", "postgresql://tidings:Xy7{}Qz9w@db.internal:5432/tidings"),
        ("TIDINGS_SMTP_URL", "smtp://user:Xy7{}Qz9w@mail.example.com:587"),
    ]),
)
def test_no_piece_of_a_password_with_a_delimiter_is_shown(
    run: Run, name: str, template: str, separator: str, tmp_path: Path
) -> None:
    """An unencoded ``/``, ``?`` or ``#`` splits the URL inside the password;
    the message must not show a piece as a port, host or parameter."""
    settings = {"DATABASE_URL": UNREACHABLE, name: template.format(separator)}
    done = run(COMMANDS["serve"], tmp_path, **settings)
    output = done.stderr + done.stdout
    assert "Xy7" not in output and "Qz9w" not in output, output


def test_a_host_that_does_not_resolve_is_not_a_database_failure(tmp_path: Path) -> None:
    runs: list[tuple[Run, str]] = [(tidings, "1"), (tidings_in_process, "2")]
    for run, workers in runs:
        done = run(
            ["serve", "--host", "nosuchhost.invalid", "--port", "18702", "--workers", workers],
            tmp_path, DATABASE_URL=UNREACHABLE,
        )
        line = assert_one_line_failure(done, "cannot listen on nosuchhost.invalid:18702")
        assert "database" not in line


@pytest.mark.parametrize(
    ("run", "seconds"), first_in_a_subprocess(["1e300", "0", "315360001"])
)
def test_expires_in_must_be_finite_and_at_most_ten_years(
    run: Run, seconds: str, tmp_path: Path
) -> None:
    done = run([*COMMANDS["tokens create"], "--expires-in", seconds], tmp_path,
               DATABASE_URL=UNREACHABLE)
    line = assert_one_line_failure(done, "--expires-in", "315360000")
    assert "database" not in line


@pytest.mark.parametrize("seconds", ["nan", "inf", "infinity"])
def test_expires_in_is_a_number_of_seconds(seconds: str, tmp_path: Path) -> None:
    done = tidings_in_process([*COMMANDS["tokens create"], "--expires-in", seconds], tmp_path,
                              DATABASE_URL=UNREACHABLE)
    assert f"must be a number, not '{seconds}'" in assert_usage_error(done, "--expires-in")


@pytest.mark.parametrize(
    ("run", "option"), first_in_a_subprocess(["--emails-per-day", "--sms-per-month"])
)
def test_a_quota_beyond_bigint_is_a_usage_error(run: Run, option: str, tmp_path: Path) -> None:
    done = run(["quotas", "set", "--team", "acme", option, "9223372036854775808"], tmp_path,
               DATABASE_URL=UNREACHABLE)
    line = assert_usage_error(done, option)
    assert "at most 9223372036854775807" in line


async def test_quotas_of_an_unknown_team_is_one_line(database_url: str, tmp_path: Path) -> None:
    for command in (["show"], ["set", "--sms-per-day", "5"]):
        done = await trio.to_thread.run_sync(lambda command=command: tidings(
            ["quotas", *command, "--team", "nosuch"], tmp_path, DATABASE_URL=database_url
        ))
        line = assert_one_line_failure(done)
        assert line == "tidings: no team 'nosuch'", done.stderr


def test_an_sms_lease_outlasts_the_providers_longest_answer() -> None:
    """An SMS's lease is not renewed while its send waits on Twilio: shorter
    than Twilio's timeout, it could run out first and the message be sent
    again by another process."""
    assert SMS_LEASE_MINIMUM_SECONDS > twilio.TIMEOUT_SECONDS
    with pytest.raises(SettingError) as refused:
        Config.from_env({"TIDINGS_SMS_LEASE_SECONDS": "10"})
    assert str(refused.value).startswith("TIDINGS_SMS_LEASE_SECONDS must "), str(refused.value)
    assert Config.from_env({"TIDINGS_SMS_LEASE_SECONDS": "20"}).sms_lease_seconds == 20


def test_a_password_with_an_at_sign_not_encoded_says_how_to_write_it() -> None:
    with pytest.raises(SettingError) as raised:
        Config.from_env({"DATABASE_URL": "postgresql://tidings:k7@q:z9@127.0.0.1:5432/db"})
    message = str(raised.value)
    assert "DATABASE_URL has a bad port" in message
    assert "percent-encoded: %40" in message
    assert "k7" not in message and "z9" not in message  # the password stays hidden


@pytest.mark.parametrize(
    ("command", "option"),
    [
        (["quotas", "set", "--team", "acme"], "--emails-per-day"),
        (["serve"], "--port"),
        (["serve"], "--workers"),
        (COMMANDS["contacts import"], "--batch-size"),
        (COMMANDS["tokens create"], "--expires-in"),
    ],
)
@pytest.mark.parametrize("number", ["５", "1_000", "٣"])
def test_numbers_of_options_are_spelled_as_the_settings_are(
    command: list[str], option: str, number: str, tmp_path: Path
) -> None:
    """``int`` takes other scripts' digits and underscores; the settings do
    not (``TIDINGS_QUOTA_EMAILS_PER_DAY=1_000`` is refused), nor do options."""
    done = tidings_in_process([*command, option, number], tmp_path, DATABASE_URL=UNREACHABLE)
    line = assert_usage_error(done, option)
    assert repr(number) in line


def test_the_connection_cap_is_the_file_limit_unless_set() -> None:
    assert Config.from_env({}).max_connections is None  # worked out when serving
    assert Config.from_env({"TIDINGS_MAX_CONNECTIONS": " "}).max_connections is None
    assert Config.from_env({"TIDINGS_MAX_CONNECTIONS": "500"}).max_connections == 500
    with pytest.raises(SettingError, match="TIDINGS_MAX_CONNECTIONS must be at least 1"):
        Config.from_env({"TIDINGS_MAX_CONNECTIONS": "0"})
