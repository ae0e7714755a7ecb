"""DKIM keys: one 2048-bit RSA key per sending domain.

Keys are made with ``cryptography`` (OpenSSL); signing is in
``tidings.email.signing``.
"""

from __future__ import annotations

import base64
import secrets

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

KEY_BITS = 2048


def new_private_key() -> bytes:
    """A new RSA key as unencrypted PKCS#1 PEM (``BEGIN RSA PRIVATE KEY``, the form
    dkimpy reads). CPU work (tens of ms): run it in a thread."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=KEY_BITS)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def public_key_base64(private_pem: bytes) -> str:
    """The ``p=`` value of the DKIM record: the DER SubjectPublicKeyInfo, base64."""
    key = serialization.load_pem_private_key(private_pem, password=None)
    der = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return base64.b64encode(der).decode("ascii")


def new_selector() -> str:
    """A selector of its own per key, so a new key never collides with an old record."""
    return f"tidings{secrets.token_hex(3)}"
