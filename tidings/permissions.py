"""The permissions a team token can carry (the spec's four and CONTRACT §3)."""

from __future__ import annotations

ALL_PERMISSIONS: tuple[str, ...] = (
    "email:read",
    "email:send",
    "sms:read",
    "sms:send",
    "contacts:read",
    "contacts:write",
    "templates:read",
    "templates:write",
    "broadcasts:read",
    "broadcasts:write",
    "broadcasts:send",
    "domains:read",
    "domains:write",
    "webhooks:read",
    "webhooks:write",
    "tokens:manage",
)

KNOWN = frozenset(ALL_PERMISSIONS)


def unknown_permissions(permissions: list[str] | tuple[str, ...]) -> list[str]:
    return [p for p in permissions if p not in KNOWN]
