"""Provider settings are checked when the Config is read: a bad one is a SettingError."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tidings.config import EMAIL_PROVIDERS, SMS_PROVIDERS, Config, SettingError, SmtpUrl
from tidings.providers.select import EMAIL_OPENERS, SMS_OPENERS, email_opener

TWILIO = {"TWILIO_ACCOUNT_SID": "AC123", "TWILIO_AUTH_TOKEN": "secret"}


def test_defaults() -> None:
    config = Config.from_env({})
    assert (config.email_provider, config.sms_provider) == ("sandbox", "sandbox")
    assert config.smtp_url is None and config.dns_nameservers == ()
    assert config.twilio_api_url == "https://api.twilio.com"
    assert config.public_url == "http://127.0.0.1:8080"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TIDINGS_EMAIL_PROVIDER": "ses"}, "TIDINGS_EMAIL_PROVIDER must be one of sandbox, smtp"),
        ({"TIDINGS_SMS_PROVIDER": "vonage"}, "TIDINGS_SMS_PROVIDER must be one of sandbox, twilio"),
        ({"TIDINGS_EMAIL_PROVIDER": "smtp"}, "TIDINGS_EMAIL_PROVIDER=smtp needs TIDINGS_SMTP_URL"),
        (
            {"TIDINGS_SMS_PROVIDER": "twilio"},
            "TIDINGS_SMS_PROVIDER=twilio needs TWILIO_ACCOUNT_SID and TWILIO_AUTH_TOKEN",
        ),
        (
            {"TIDINGS_SMS_PROVIDER": "twilio", "TWILIO_ACCOUNT_SID": "AC1"},
            "TIDINGS_SMS_PROVIDER=twilio needs TWILIO_AUTH_TOKEN",
        ),
        ({"TIDINGS_SMTP_URL": "http://mail.test"}, "TIDINGS_SMTP_URL must look like"),
        ({"TIDINGS_SMTP_URL": "smtp://"}, "TIDINGS_SMTP_URL must look like"),
        ({"TIDINGS_SMTP_URL": "smtp://mail.test:99999"}, "TIDINGS_SMTP_URL has a bad port"),
        ({"TIDINGS_SMTP_URL": "smtp://mail.test:x"}, "TIDINGS_SMTP_URL has a bad port"),
        ({"TIDINGS_SMTP_URL": "smtp://mail.test?starttls=yes"}, "starttls must be require"),
        ({"TIDINGS_SMTP_URL": "smtp://mail.test?tls=1"}, "unknown parameter 'tls'"),
        ({"TIDINGS_SMTP_URL": "smtps://mail.test?starttls=require"}, "does not apply to smtps"),
        ({"TIDINGS_SMTP_URL": "smtp://mail.test/path"}, "must not have a path"),
        ({"TIDINGS_DNS_NAMESERVERS": "dns.google"}, "'dns.google' is not ip[:port]"),
        ({"TIDINGS_DNS_NAMESERVERS": "1.1.1.1:0"}, "has a port outside 1..65535"),
        ({"TIDINGS_DNS_NAMESERVERS": "[::1]x"}, "'[::1]x' is not ip[:port]"),
        ({"TIDINGS_DNS_NAMESERVERS": "1.1.1.1,"}, "'' is not ip[:port]"),
        ({"TIDINGS_PUBLIC_URL": "ftp://x.test"}, "TIDINGS_PUBLIC_URL must be an http://"),
        ({"TIDINGS_PUBLIC_URL": "localhost:8080"}, "TIDINGS_PUBLIC_URL must be an http://"),
        ({"TIDINGS_PUBLIC_URL": "http://x.test/?a=1"}, "must not have a query"),
        ({"TIDINGS_TWILIO_API_URL": "http://x.test:abc"}, "TIDINGS_TWILIO_API_URL has a bad port"),
    ],
)
def test_bad_settings_are_refused_in_one_line(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingError) as refused:
        Config.from_env(env)
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_smtp_url() -> None:
    config = Config.from_env(
        {
            "TIDINGS_EMAIL_PROVIDER": "SMTP",
            "TIDINGS_SMTP_URL": "smtp://user%40acme:p%3Ass@mail.test:2525?starttls=require",
        }
    )
    assert config.email_provider == "smtp"
    assert config.smtp_url == SmtpUrl(
        host="mail.test", port=2525, implicit_tls=False, starttls="require",
        username="user@acme", password="p:ss",
    )
    assert "p:ss" not in repr(config)


@pytest.mark.parametrize(
    ("url", "port", "implicit", "starttls"),
    [
        ("smtp://mail.test", 25, False, "auto"),
        ("smtp://mail.test:587?starttls=off", 587, False, "off"),
        ("smtps://mail.test", 465, True, "off"),
        ("smtps://mail.test:4650?starttls=off", 4650, True, "off"),
    ],
)
def test_smtp_url_defaults(url: str, port: int, implicit: bool, starttls: str) -> None:
    parsed = Config.from_env({"TIDINGS_SMTP_URL": url}).smtp_url
    assert parsed is not None
    assert (parsed.host, parsed.port, parsed.implicit_tls, parsed.starttls) == (
        "mail.test", port, implicit, starttls,
    )
    assert parsed.username is None and parsed.password is None


def test_twilio_settings() -> None:
    config = Config.from_env(
        {
            "TIDINGS_SMS_PROVIDER": "twilio",
            **TWILIO,
            "TIDINGS_TWILIO_API_URL": "http://127.0.0.1:9000/",
            "TIDINGS_PUBLIC_URL": "https://tidings.example.com/base/",
        }
    )
    assert config.sms_provider == "twilio"
    assert (config.twilio_account_sid, config.twilio_auth_token) == ("AC123", "secret")
    assert config.twilio_api_url == "http://127.0.0.1:9000"
    assert config.public_url == "https://tidings.example.com/base"
    assert "secret" not in repr(config)


def test_nameservers() -> None:
    config = Config.from_env(
        {"TIDINGS_DNS_NAMESERVERS": "127.0.0.1:5353, 8.8.8.8,[::1]:53, 2001:db8::1"}
    )
    assert config.dns_nameservers == (
        ("127.0.0.1", 5353), ("8.8.8.8", 53), ("::1", 53), ("2001:db8::1", 53),
    )


def test_every_provider_name_has_an_opener() -> None:
    assert tuple(EMAIL_OPENERS) == EMAIL_PROVIDERS
    assert tuple(SMS_OPENERS) == SMS_PROVIDERS
    with pytest.raises(LookupError, match="no provider 'ses'"):
        email_opener("ses")


def test_serve_stops_at_start_with_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIDINGS_", "TWILIO_"))}
    env |= {"TIDINGS_SMS_PROVIDER": "twilio", "TWILIO_ACCOUNT_SID": "AC1"}
    done = subprocess.run(
        [sys.executable, "-m", "tidings", "serve", "--port", "0"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr == "tidings: TIDINGS_SMS_PROVIDER=twilio needs TWILIO_AUTH_TOKEN\n"
    assert done.stdout == ""
