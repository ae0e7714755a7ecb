"""The base of every request body model, of list queries with filters, of
response bodies made from storage objects, and the OpenAPI description of
list responses and of responses outside the envelope."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, create_model, field_validator

from tidings.fields import refuse_unstorable
from tidings.http.paging import Paging


class RequestBody(BaseModel):
    """Strict JSON: no unknown fields, no type coercion, no NUL characters
    (PostgreSQL text cannot hold them), no NaN or infinities (JSON has none)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    storable = field_validator("*", mode="after")(refuse_unstorable)


class ListQuery(Paging):
    """Paging and a list route's filters (which Paging keeps free of NUL characters)."""


class Resource(BaseModel):
    """A response body read from the attributes of a storage object of the same
    names (fields it lacks, such as ``object``, keep their defaults)."""

    model_config = ConfigDict(from_attributes=True)

    @classmethod
    def of(cls, found: object) -> Self:
        return cls.model_validate(found)


@functools.cache
def list_of(model: type[BaseModel]) -> type[BaseModel]:
    """The OpenAPI description of a list's ``data``: ``{object: "list", data: [...], has_more}``
    (what ``paging.page`` returns), named ``<Model>List``."""
    name = model.__name__.removesuffix("Out") + "List"
    return create_model(
        name,
        __doc__=f"A page of {model.__name__.removesuffix('Out')} objects, newest first.",
        object=(Literal["list"], "list"),  # type: ignore[arg-type,maybe-unrecognized-str-typeform]
        data=(list[model], ...),  # type: ignore[valid-type]
        has_more=(bool, ...),
    )


@dataclass(frozen=True)
class RawContent:
    """The response of a route that answers something other than the JSON envelope
    (``response=RawContent(...)`` in its declaration): its media type and schema."""

    media_type: str
    schema: dict[str, Any]
    # Other media types the route answers, chosen by the request's Accept.
    also: tuple[tuple[str, dict[str, Any]], ...] = ()
