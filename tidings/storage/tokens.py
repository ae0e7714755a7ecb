"""Teams and their API tokens.

A token's secret is ``svc_team_`` followed by 32 random bytes (base64url);
only its SHA-256 is stored. Lookups go by that hash, and the stored hash is
compared with the presented one in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import unicodedata
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

TOKEN_PREFIX = "svc_team_"
# Step-up tokens live at most this long (CONTRACT §2).
STEP_UP_MAX_SECONDS = 15 * 60
TEAM_NAME_MAX_LENGTH = 100

UPSERT_TEAM = """
INSERT INTO teams (name) VALUES ($1)
ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name
RETURNING id
"""

# Every process LISTENs here and forgets a revoked token at once.
REVOKED_CHANNEL = "tidings_token_revoked"

TOKEN_COLUMNS = (
    "id, team_id, name, prefix, permissions, step_up, created_at, expires_at, revoked_at"
)

INSERT_TOKEN = f"""
INSERT INTO api_tokens (team_id, name, secret_hash, prefix, permissions, step_up, expires_at)
VALUES ($1, $2, $3, $4, $5, $6,
        CASE WHEN $7::float8 IS NULL THEN NULL ELSE now() + make_interval(secs => $7::float8) END)
RETURNING {TOKEN_COLUMNS}
"""

SELECT_BY_HASH = f"SELECT secret_hash, {TOKEN_COLUMNS} FROM api_tokens WHERE secret_hash = $1"

SELECT_TEAM_TOKENS = f"""
SELECT {TOKEN_COLUMNS} FROM api_tokens
WHERE team_id = $1
ORDER BY created_at DESC, id DESC
LIMIT $2 OFFSET $3
"""

REVOKE_TOKEN = f"""
WITH revoked AS (
    UPDATE api_tokens SET revoked_at = COALESCE(revoked_at, now())
    WHERE id = $1 AND ($2::uuid IS NULL OR team_id = $2)
    RETURNING {TOKEN_COLUMNS}
)
SELECT {TOKEN_COLUMNS}, pg_notify('{REVOKED_CHANNEL}', id::text) FROM revoked
"""


@dataclass(frozen=True)
class Token:
    id: UUID
    team_id: UUID
    name: str | None
    prefix: str
    permissions: tuple[str, ...]
    step_up: bool
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None

    @property
    def expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= datetime.now(UTC)

    @property
    def active(self) -> bool:
        return self.revoked_at is None and not self.expired

    @classmethod
    def from_row(cls, row: Any) -> Token:
        return cls(
            id=row["id"],
            team_id=row["team_id"],
            name=row["name"],
            prefix=row["prefix"],
            permissions=tuple(row["permissions"]),
            step_up=row["step_up"],
            created_at=row["created_at"],
            expires_at=row["expires_at"],
            revoked_at=row["revoked_at"],
        )


def new_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def check_team_name(name: str) -> str:
    """``name`` without surrounding whitespace, or ValueError saying why it is not one.

    A team name holds 1 to 100 characters once trimmed, none of them a
    control or format character (newlines, tabs, NUL, zero-width marks).
    """
    trimmed = name.strip()
    if not trimmed:
        raise ValueError("a team name must not be empty or only whitespace")
    if len(trimmed) > TEAM_NAME_MAX_LENGTH:
        raise ValueError(
            f"a team name holds at most {TEAM_NAME_MAX_LENGTH} characters, got {len(trimmed)}"
        )
    for char in trimmed:
        if unicodedata.category(char) in ("Cc", "Cf", "Cs", "Co", "Cn"):
            raise ValueError(
                f"a team name must not contain control or invisible characters "
                f"(found U+{ord(char):04X})"
            )
    return trimmed


async def ensure_team(conn: Any, name: str) -> UUID:
    """The id of the team called ``name`` (trimmed), created if it does not exist.

    ValueError if ``name`` is not a valid team name (``check_team_name``).
    """
    team_id: UUID = await conn.fetchval(UPSERT_TEAM, check_team_name(name))
    return team_id


async def create_token(
    conn: Any,
    team_id: UUID,
    permissions: list[str] | tuple[str, ...],
    *,
    name: str | None = None,
    expires_in: float | None = None,
    step_up: bool = False,
) -> tuple[Token, str]:
    """Create a token; return it and its secret (the only time the secret exists)."""
    if step_up:
        expires_in = STEP_UP_MAX_SECONDS if expires_in is None else min(
            expires_in, STEP_UP_MAX_SECONDS
        )
    secret = new_secret()
    row = await conn.fetchrow(
        INSERT_TOKEN,
        team_id,
        name,
        hash_secret(secret),
        secret[: len(TOKEN_PREFIX) + 6],
        sorted(set(permissions)),
        step_up,
        expires_in,
    )
    return Token.from_row(row), secret


async def find_by_hash(conn: Any, secret_hash: bytes) -> Token | None:
    """The token whose secret has this hash, whether or not it is still active."""
    row = await conn.fetchrow(SELECT_BY_HASH, secret_hash)
    if row is None or not hmac.compare_digest(bytes(row["secret_hash"]), secret_hash):
        return None
    return Token.from_row(row)



async def list_tokens(conn: Any, team_id: UUID, limit: int, offset: int) -> list[Token]:
    rows = await conn.fetch(SELECT_TEAM_TOKENS, team_id, limit, offset)
    return [Token.from_row(row) for row in rows]


async def revoke_token(conn: Any, token_id: UUID, team_id: UUID | None = None) -> Token | None:
    """Revoke a token (of ``team_id`` when given); None if there is no such token."""
    row = await conn.fetchrow(REVOKE_TOKEN, token_id, team_id)
    return None if row is None else Token.from_row(row)
