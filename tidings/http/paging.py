"""Offset paging (CONTRACT §2) and the list envelope."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from tidings.fields import refuse_nul

MAX_LIMIT = 100
# Further than any list goes; larger numbers would overflow PostgreSQL's bigint.
MAX_OFFSET = 1_000_000_000
_INTEGER = re.compile(r"[+-]?[0-9]+")


def integer_text(value: Any) -> Any:
    """A query value must be written as an integer: "1.0" and "1e2" are not."""
    if isinstance(value, str) and not _INTEGER.fullmatch(value.strip()):
        raise ValueError("must be an integer")
    return value


QueryInt = Annotated[int, BeforeValidator(integer_text)]


class Paging(BaseModel):
    """``limit`` 1..100 (larger values are capped at 100), ``offset`` 0..10⁹."""

    model_config = ConfigDict(extra="forbid")

    limit: QueryInt = Field(50, ge=1, description="1 to 100; larger values are capped at 100")
    offset: QueryInt = Field(0, ge=0, le=MAX_OFFSET)

    @field_validator("limit", mode="after")
    @classmethod
    def cap(cls, value: int) -> int:
        return min(value, MAX_LIMIT)

    # PostgreSQL text cannot hold NUL: a filter with one is 400, not 500.
    no_nul = field_validator("*", mode="after")(refuse_nul)


def page(items: Sequence[Any], limit: int) -> dict[str, Any]:
    """The list envelope from ``limit + 1`` fetched items."""
    return {"object": "list", "data": list(items[:limit]), "has_more": len(items) > limit}
