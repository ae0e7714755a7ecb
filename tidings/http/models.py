"""The base of every request body model, of list queries with filters, and the
OpenAPI description of list responses and of responses outside the envelope."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, create_model, field_validator

from tidings.http.paging import Paging


def has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(has_nul(k) or has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(has_nul(item) for item in value)
    return False


class RequestBody(BaseModel):
    """Strict JSON: no unknown fields, no type coercion, no NUL characters
    (PostgreSQL text cannot hold them)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @field_validator("*", mode="after")
    @classmethod
    def no_nul(cls, value: Any) -> Any:
        if has_nul(value):
            raise ValueError("must not contain NUL characters (\\u0000)")
        return value


class ListQuery(Paging):
    """Paging and a list route's filters. No NUL characters in a filter either."""

    @field_validator("*", mode="after")
    @classmethod
    def no_nul(cls, value: Any) -> Any:
        if has_nul(value):
            raise ValueError("must not contain NUL characters (\\u0000)")
        return value


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
