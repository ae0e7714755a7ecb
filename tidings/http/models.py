"""The base of every request body model, of list queries with filters, and of
response bodies made from storage objects."""

from __future__ import annotations

from typing import Self

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


class Resource(BaseModel):
    """A response body read from the attributes of a storage object of the same
    names (fields it lacks, such as ``object``, keep their defaults)."""

    model_config = ConfigDict(from_attributes=True)

    @classmethod
    def of(cls, found: object) -> Self:
        return cls.model_validate(found)
