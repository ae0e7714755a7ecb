"""The base of every request body model, and of list queries with filters."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, field_validator

from tidings.fields import refuse_nul
from tidings.http.paging import Paging


class RequestBody(BaseModel):
    """Strict JSON: no unknown fields, no type coercion, no NUL characters
    (PostgreSQL text cannot hold them)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    no_nul = field_validator("*", mode="after")(refuse_nul)


class ListQuery(Paging):
    """Paging and a list route's filters (which Paging keeps free of NUL characters)."""
