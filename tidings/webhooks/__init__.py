"""Webhooks: what receivers need (verification) and how Tidings signs.

Receivers written in Python verify a request with :func:`verify`::

    from tidings.webhooks import verify, WebhookVerificationError

    event = verify(raw_body, request.headers["X-Service-Signature"], ["whsec_..."])

Importing this package pulls in nothing but the standard library.
"""

from tidings.webhooks.signing import (
    DEFAULT_TOLERANCE_SECONDS,
    Signer,
    WebhookVerificationError,
    sign,
    signature_header,
    verify,
)

__all__ = [
    "DEFAULT_TOLERANCE_SECONDS",
    "Signer",
    "WebhookVerificationError",
    "sign",
    "signature_header",
    "verify",
]
