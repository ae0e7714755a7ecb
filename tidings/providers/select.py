"""Choosing the providers by setting (``TIDINGS_EMAIL_PROVIDER``, ``TIDINGS_SMS_PROVIDER``).

Each provider lives in its own module and exposes an opener: a function of
the ``Config`` that returns an async context manager yielding the provider
(which may hold connection pools or tasks for as long as it is open). The
tables below name them by module path, so that a provider's dependencies
(an SMTP client, DKIM) are imported only when it is chosen. A new provider
is one row here and its name in ``tidings.config``; the settings it needs
are checked when the Config is read, so a bad choice stops ``tidings serve``
at start, before anything opens.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import cast

from tidings.config import Config
from tidings.providers.email import EmailProvider
from tidings.providers.sms import SmsProvider

EmailOpener = Callable[[Config], AbstractAsyncContextManager[EmailProvider]]
SmsOpener = Callable[[Config], AbstractAsyncContextManager[SmsProvider]]

# name -> "module:opener". The smtp and twilio modules define ``open_provider``.
EMAIL_OPENERS: dict[str, str] = {
    "sandbox": "tidings.providers.sandbox:open_sandbox_email",
    "smtp": "tidings.providers.smtp:open_provider",
}
SMS_OPENERS: dict[str, str] = {
    "sandbox": "tidings.providers.sandbox:open_sandbox_sms",
    "twilio": "tidings.providers.twilio:open_provider",
}


def _load(table: dict[str, str], name: str, setting: str) -> object:
    try:
        path = table[name]
    except KeyError:
        raise LookupError(f"{setting}: no provider {name!r}; known: {', '.join(table)}") from None
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def email_opener(name: str) -> EmailOpener:
    return cast(EmailOpener, _load(EMAIL_OPENERS, name, "TIDINGS_EMAIL_PROVIDER"))


def sms_opener(name: str) -> SmsOpener:
    return cast(SmsOpener, _load(SMS_OPENERS, name, "TIDINGS_SMS_PROVIDER"))


def open_email_provider(config: Config) -> AbstractAsyncContextManager[EmailProvider]:
    """``async with open_email_provider(config) as provider:`` the chosen email provider."""
    return email_opener(config.email_provider)(config)


def open_sms_provider(config: Config) -> AbstractAsyncContextManager[SmsProvider]:
    """``async with open_sms_provider(config) as provider:`` the chosen SMS provider."""
    return sms_opener(config.sms_provider)(config)
