"""The base of every request body model, of list queries with filters, of
response bodies made from storage objects, and the OpenAPI description of
list responses and of responses outside the envelope."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    create_model,
    field_validator,
    model_validator,
)

from tidings.fields import refuse_unstorable
from tidings.http.paging import Paging


class RequestBody(BaseModel):
    """Strict JSON: no unknown fields, no type coercion, no NUL characters
    (PostgreSQL text cannot hold them), no NaN or infinities (JSON has none)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    storable = field_validator("*", mode="after")(refuse_unstorable)


def never_null(schema: dict[str, Any]) -> None:
    """The schema of a field that may be omitted but never null: no ``null``
    branch and no ``default: null`` (outside the field's own type), so that
    clients generated from the document never send the null the model or
    the route refuses. Its Python type keeps ``None``, meaning omitted."""
    schema.pop("default", None)
    branches = schema.pop("anyOf", None)
    if branches is None:
        return
    kept = [branch for branch in branches if branch != {"type": "null"}]
    if len(kept) == 1:
        schema.update(kept[0])
    else:
        schema["anyOf"] = kept


# The default of a PATCH field that is never null: omitted, it is None and the
# field is unchanged; given as null, it is refused (by the model or the route).
UNCHANGED = Field(None, json_schema_extra=never_null)

# The config of a PATCH body that refuses ``{}`` (pydantic merges it with
# RequestBody's): ``minProperties: 1`` tells clients before the 400 does.
NOT_EMPTY = ConfigDict(json_schema_extra={"minProperties": 1})


# RFC 3339's date-time; the offset is checked by each route, which names it.
_DATE_TIME = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})?"
)
# "+02:00" arrives as " 02:00" in a query string whose "+" was not percent-encoded.
_SPACED_OFFSET = re.compile(r"^(\S+T\S+) (\d{2}:?\d{2})$")


_INFINITIES = (datetime.min, datetime.max)


def moment(value: Any) -> datetime:
    """An RFC 3339 date-time (a ``datetime`` as it is), or ValueError: no
    Unix times, no bare dates, nothing outside the years 1 to 9999 once
    its offset is applied."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        raise ValueError("must be an RFC 3339 date-time string, e.g. 2026-11-23T10:00:00Z")
    found = _DATE_TIME.fullmatch(_SPACED_OFFSET.sub(r"\1+\2", value.strip()))
    if found is None:
        raise ValueError(
            f"{value!r} is not an RFC 3339 date-time (e.g. 2026-11-23T10:00:00Z or "
            "2026-11-23T12:00:00+02:00)"
        )
    day, time, fraction, offset = found.groups()
    zone = "+00:00" if offset in ("Z", "z") else offset or ""
    text = f"{day}T{time}.{(fraction or '0')[:6]:0<6}{zone}"
    try:
        parsed = datetime.fromisoformat(text)
        utc = parsed.astimezone(UTC) if parsed.tzinfo is not None else parsed
    except OverflowError:
        raise ValueError("is out of range: the moment falls outside years 1 to 9999") from None
    except ValueError:
        raise ValueError(f"{value!r} is not a valid date and time") from None
    if utc.replace(tzinfo=None) in _INFINITIES:
        # The driver writes these two as PostgreSQL's infinity and -infinity,
        # which would come back as neither the moment given nor RFC 3339.
        raise ValueError(
            "is out of range: the moment must be after 0001-01-01T00:00:00Z and "
            "before 9999-12-31T23:59:59.999999Z"
        )
    return parsed


# A moment given by a client, in a body or a query (see ``moment``).
Moment = Annotated[datetime, BeforeValidator(moment)]


class ListQuery(Paging):
    """Paging and a list route's filters (which Paging keeps free of NUL characters)."""


def past_microsecond(value: Any) -> Decimal:
    """What the RFC 3339 ``value`` gives past its microsecond, in
    microseconds (0 to below 1: RFC 3339 takes any number of digits, a
    ``datetime`` holds six); 0 for anything else."""
    if not isinstance(value, str):
        return Decimal(0)
    found = _DATE_TIME.fullmatch(_SPACED_OFFSET.sub(r"\1+\2", value.strip()))
    rest = ((found.group(3) if found else None) or "")[6:].rstrip("0")
    return Decimal(f"0.{rest}") if rest else Decimal(0)


class CreatedRangeQuery(ListQuery):
    """A list filtered by creation time: ``start_date`` inclusive, ``end_date``
    inclusive. Times are kept to microseconds; a ``start_date`` with finer
    digits counts from the next microsecond (``starts_from``), so nothing
    created before it is listed, and ``end_precedes_start`` compares the two
    as given, to the last digit."""

    start_date: Moment | None = Field(None, description="Created at or after (RFC 3339)")
    end_date: Moment | None = Field(None, description="Created at or before (RFC 3339)")
    _starts_from: datetime | None = PrivateAttr(None)
    _inverted: bool = PrivateAttr(False)

    @model_validator(mode="wrap")
    @classmethod
    def _exact_range(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        query = handler(data)
        raw = data if isinstance(data, dict) else {}
        start_ns = past_microsecond(raw.get("start_date"))
        end_ns = past_microsecond(raw.get("end_date"))
        start, end = query.start_date, query.end_date
        query._starts_from = start
        if start is not None and start_ns:
            try:
                query._starts_from = start + timedelta(microseconds=1)
            except OverflowError:
                raise ValueError("start_date: is out of range: after year 9999") from None
        if start is not None and end is not None and (
            (start.tzinfo is None) == (end.tzinfo is None)
        ):
            query._inverted = (end, end_ns) < (start, start_ns)
        return query

    @property
    def starts_from(self) -> datetime | None:
        return self._starts_from

    @property
    def end_precedes_start(self) -> bool:
        return self._inverted


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
