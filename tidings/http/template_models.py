"""The request and response bodies of the template routes (``tidings.http.templates``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Self
from uuid import UUID

from pydantic import BaseModel, Field, field_validator, model_validator

from tidings.addresses import parse_address
from tidings.fields import FieldError
from tidings.http.models import NOT_EMPTY, RequestBody, Resource, never_null
from tidings.http.paging import Paging
from tidings.rendering import (
    CONTROL_CHARACTERS,
    KEY_PATTERN,
    MAX_KEY_LENGTH,
    MAX_VARIABLES,
    Variable,
    VariableType,
)
from tidings.storage import templates as store

Category = Literal["otp", "welcome", "receipt", "alert", "notification", "custom"]
ALIAS_PATTERN = r"^[A-Za-z0-9_-]+$"
MAX_ALIAS_LENGTH = 100
MAX_FROM_LENGTH = 255


# --- request bodies -------------------------------------------------------------------


class VariableIn(RequestBody):
    key: str = Field(
        min_length=1, max_length=MAX_KEY_LENGTH, pattern=KEY_PATTERN,
        description="Written {{{key}}} in the subject, html and text; unique in a version",
    )
    type: VariableType
    fallback_value: str | int | float | bool | None = Field(
        None,
        description="Of the variable's type; used when a render supplies no value. "
        "null: a value must be supplied",
    )

    def variable(self) -> Variable:
        return Variable(key=self.key, type=self.type, fallback_value=self.fallback_value)


def _alias_is_not_a_uuid(value: str | None) -> str | None:
    if value is not None:
        try:
            UUID(value)
        except ValueError:
            return value
        raise ValueError("must not have the form of a UUID: ids and aliases share the paths")
    return value


def _email_address(value: str | None) -> str | None:
    """One bare email address (syntax only, no DNS), normalized; a display name or
    a comment is refused, since only the address is kept."""
    if value is None:
        return value
    try:
        return parse_address(value, "reply_to")
    except FieldError as error:
        raise ValueError(error.reason) from None


def _one_line(value: str | None) -> str | None:
    """A subject is a mail header: the rules of POST /emails' ``subject``."""
    if value is not None:
        if "\n" in value or "\r" in value:
            raise ValueError("must not contain line breaks")
        if CONTROL_CHARACTERS.search(value):
            raise ValueError("control characters are not allowed")
    return value


class CreateTemplate(RequestBody):
    name: str = Field(min_length=1, max_length=100)
    alias: str | None = Field(
        None, min_length=1, max_length=MAX_ALIAS_LENGTH, pattern=ALIAS_PATTERN,
        description="Unique in the team; usable wherever the template's id is",
    )
    category: Category | None = None
    from_: str | None = Field(
        None, alias="from", max_length=MAX_FROM_LENGTH,
        description="An email address, optionally with a display name: 'Acme <hi@acme.com>'",
    )
    reply_to: str | None = Field(
        None, max_length=320, json_schema_extra={"format": "email"},
        description="One email address, without a display name: 'help@acme.com'",
    )
    subject: str = Field(min_length=1, description="One line; may hold placeholders")
    html: str = Field(min_length=1, description="May hold placeholders: {{{key}}}")
    text: str | None = Field(
        None, min_length=1,
        description="May hold placeholders; without it a text part is derived from the html",
    )
    variables: list[VariableIn] = Field(default_factory=list, max_length=MAX_VARIABLES)

    check_alias = field_validator("alias")(_alias_is_not_a_uuid)
    check_subject = field_validator("subject")(_one_line)
    check_reply_to = field_validator("reply_to")(_email_address)


class UpdateTemplate(RequestBody):
    """Fields not given are kept; ``null`` clears an optional one. ``name``,
    ``subject``, ``html`` and ``variables`` may be changed, not cleared."""

    model_config = NOT_EMPTY

    name: str | None = Field(None, min_length=1, max_length=100, json_schema_extra=never_null)
    alias: str | None = Field(
        None, min_length=1, max_length=MAX_ALIAS_LENGTH, pattern=ALIAS_PATTERN
    )
    category: Category | None = None
    from_: str | None = Field(None, alias="from", max_length=MAX_FROM_LENGTH)
    reply_to: str | None = Field(None, max_length=320, json_schema_extra={"format": "email"})
    subject: str | None = Field(None, min_length=1, json_schema_extra=never_null)
    html: str | None = Field(None, min_length=1, json_schema_extra=never_null)
    text: str | None = Field(None, min_length=1)
    variables: list[VariableIn] | None = Field(
        None, max_length=MAX_VARIABLES, json_schema_extra=never_null
    )
    change_note: str | None = Field(
        None, min_length=1, max_length=500, description="Kept on the new version"
    )

    check_alias = field_validator("alias")(_alias_is_not_a_uuid)
    check_subject = field_validator("subject")(_one_line)
    check_reply_to = field_validator("reply_to")(_email_address)

    @field_validator("name", "subject", "html", "variables")
    @classmethod
    def not_null(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("must not be null: it may be changed, not removed")
        return value

    @model_validator(mode="after")
    def not_empty(self) -> Self:
        if not self.model_fields_set:
            raise ValueError("nothing to change: send at least one field")
        return self


class PublishTemplate(RequestBody):
    version_id: UUID | None = Field(
        None, description="A version of this template; default: the current draft"
    )


class RenderTemplate(RequestBody):
    variables: dict[str, Any] = Field(default_factory=dict)
    version_id: UUID | None = Field(
        None, description="A version of this template; default: the published one, "
        "else the current draft",
    )


class TemplateQuery(Paging):
    category: Category | None = None
    search: str | None = Field(
        None, min_length=1, max_length=100,
        description="Case-insensitive part of the name or the alias",
    )


# --- responses ---------------------------------------------------------------------------


class VariableOut(Resource):
    key: str
    type: VariableType
    fallback_value: str | int | float | bool | None


class TemplateVersionOut(Resource):
    """An immutable version. Every field is present; those without a value are null."""

    object: Literal["template_version"] = "template_version"
    id: UUID
    team_id: UUID
    template_id: UUID
    version_number: int
    subject: str
    html: str
    variables: list[VariableOut]
    created_at: datetime
    from_email: str | None
    from_name: str | None
    reply_to_email: str | None
    text: str | None
    based_on_version_id: UUID | None
    change_note: str | None


class TemplateOut(BaseModel):
    """A template: its own fields and which of its versions are current and published."""

    object: Literal["template"] = "template"
    id: UUID
    team_id: UUID
    name: str
    alias: str | None
    category: Category | None
    status: Literal["draft", "published"] = Field(
        description="published once any version has been published"
    )
    current_version_id: UUID = Field(description="The current draft: the newest version")
    current_version_number: int
    published_version_id: UUID | None = Field(description="The version sends use")
    published_version_number: int | None
    published_at: datetime | None
    has_unpublished_changes: bool = Field(
        description="The current draft is not the published version"
    )
    created_at: datetime
    updated_at: datetime

    @classmethod
    def fields_of(cls, template: store.Template) -> dict[str, Any]:
        return {
            "id": template.id,
            "team_id": template.team_id,
            "name": template.name,
            "alias": template.alias,
            "category": template.category,
            "status": "draft" if template.published_version_id is None else "published",
            "current_version_id": template.current_version_id,
            "current_version_number": template.current_version_number,
            "published_version_id": template.published_version_id,
            "published_version_number": template.published_version_number,
            "published_at": template.published_at,
            "has_unpublished_changes": (
                template.current_version_id != template.published_version_id
            ),
            "created_at": template.created_at,
            "updated_at": template.updated_at,
        }

    @classmethod
    def of(cls, template: store.Template) -> TemplateOut:
        return cls(**cls.fields_of(template))


class TemplateDetail(TemplateOut):
    """A template with its current draft and its published version in full."""

    current_version: TemplateVersionOut
    published_version: TemplateVersionOut | None


class TemplateCreated(BaseModel):
    object: Literal["template"] = "template"
    id: UUID


class TemplateList(BaseModel):
    object: Literal["list"] = "list"
    data: list[TemplateOut]
    has_more: bool


class VersionList(BaseModel):
    object: Literal["list"] = "list"
    data: list[TemplateVersionOut]
    has_more: bool


class RenderedTemplate(BaseModel):
    subject: str = Field(description="The version's subject, values filled in")
    html: str
    text: str = Field(description="The version's text part, or one derived from its html")
    version_id: UUID = Field(description="The version rendered")
    version_number: int
