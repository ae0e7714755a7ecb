"""Roles of the test database server: a URL that logs in as another role."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def url_as(database_url: str, role: str) -> str:
    """``database_url`` with ``role`` as its user, without a password (the
    test server trusts its local connections)."""
    parts = urlsplit(database_url)
    host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=f"{role}@{host}"))
