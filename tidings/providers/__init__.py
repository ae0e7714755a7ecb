"""Where messages go: the email and SMS provider interfaces, the sandbox
implementations (CONTRACT §9) and the choice between providers by setting.

- ``tidings.providers.email``: ``EmailProvider``, ``OutgoingEmail``, ``EmailResult``
- ``tidings.providers.sms``: ``SmsProvider``, ``OutgoingSms``, ``SmsResult``
- ``tidings.providers.sandbox``: the default providers
- ``tidings.providers.select``: ``open_email_provider(config)``, ``open_sms_provider(config)``
"""
