"""Offset paging (CONTRACT §2) and the list envelope."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_LIMIT = 100


class Paging(BaseModel):
    """``limit`` 1..100 (larger values are capped at 100), ``offset`` ≥ 0."""

    model_config = ConfigDict(extra="forbid")

    limit: int = Field(50, ge=1, description="1 to 100; larger values are capped at 100")
    offset: int = Field(0, ge=0)

    @field_validator("limit", mode="after")
    @classmethod
    def cap(cls, value: int) -> int:
        return min(value, MAX_LIMIT)


def page(items: Sequence[Any], limit: int) -> dict[str, Any]:
    """The list envelope from ``limit + 1`` fetched items."""
    return {"object": "list", "data": list(items[:limit]), "has_more": len(items) > limit}
