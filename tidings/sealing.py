"""Sealed responses: what the idempotency table holds for a response that carries a secret.

A response that shows a secret (a new token, a webhook endpoint's signing
secret) must stay replayable under its ``Idempotency-Key`` without the
secret ever being readable in the database. It is stored sealed: AES-256-GCM
with a key that is never in the database, bound to its credential and key so
that a sealed body cannot be moved to another record.

The key comes from ``TIDINGS_SECRET_KEY``; without it, from the file
``secret.key`` in ``TIDINGS_DATA_DIR`` when the database is the embedded one
(the key lives beside the data it protects), and otherwise from a fresh
random key at every start. A worker of ``tidings serve --workers N`` uses
the key its parent hands it (``HANDED_KEY_ENV``), so that every worker
of a set has the same one. A body sealed under a key a process does not
have cannot be opened: that replay is refused with 409 (see docs/api.md).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tidings.config import Config

# JSON bodies never begin with NUL, so the prefix tells a sealed body apart.
SEALED_PREFIX = b"\x00tidings-sealed-v1\x00"
KEY_FILE = "secret.key"
# The key (hex) a ``tidings serve --workers N`` parent hands its workers.
HANDED_KEY_ENV = "TIDINGS_WORKER_SEALING_KEY"
KEY_BYTES = 32
NONCE_BYTES = 12


class Sealer:
    """Seals and opens bodies with one key."""

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"a sealing key has {KEY_BYTES} bytes, not {len(key)}")
        self._aead = AESGCM(key)

    def seal(self, plain: bytes, context: bytes) -> bytes:
        """``plain`` encrypted and authenticated together with ``context``."""
        nonce = secrets.token_bytes(NONCE_BYTES)
        return SEALED_PREFIX + nonce + self._aead.encrypt(nonce, plain, context)

    def open(self, sealed: bytes, context: bytes) -> bytes | None:
        """The plain body, or None if it was sealed with another key or context."""
        rest = sealed[len(SEALED_PREFIX):]
        nonce, ciphertext = rest[:NONCE_BYTES], rest[NONCE_BYTES:]
        try:
            return self._aead.decrypt(nonce, ciphertext, context)
        except InvalidTag:
            return None


def is_sealed(body: bytes) -> bool:
    return body.startswith(SEALED_PREFIX)


def load_key(config: Config) -> bytes:
    """The sealing key of this process (see the module's docstring for where from).

    Two processes that share a data dir read the same key file; the first
    to start writes it (mode 0600), atomically.
    """
    if config.secret_key is not None:
        return config.secret_key
    handed = os.environ.get(HANDED_KEY_ENV)
    if handed:
        return bytes.fromhex(handed)
    if config.database_url is not None:
        return secrets.token_bytes(KEY_BYTES)
    return _key_file(config.data_dir / KEY_FILE)


def _key_file(path: Path) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        staged = path.with_name(f".{KEY_FILE}.{os.getpid()}")
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(secrets.token_bytes(KEY_BYTES))
        try:
            # link() fails if another process wrote the file first: use theirs.
            os.link(staged, path)
        except FileExistsError:
            pass
        finally:
            staged.unlink()
        key = path.read_bytes()
    if len(key) != KEY_BYTES:
        raise ValueError(f"{path} must hold {KEY_BYTES} bytes, not {len(key)}")
    return key
