"""Templates over HTTP: immutable numbered versions, publishing, and render previews.

Every ``{template}`` in a path is the template's id or its alias. A change
(PATCH), of the content or of the template's name, alias or category, never
edits a version: it adds one based on the current draft.
Decisions are written up in docs/templates.md.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Self
from uuid import UUID

from pydantic import BaseModel, Field, field_validator, model_validator

from tidings.addresses import parse_address, parse_mailbox
from tidings.fields import FieldError
from tidings.http.envelope import bad_request, not_found, unprocessable
from tidings.http.models import RequestBody
from tidings.http.paging import Paging, page
from tidings.http.routing import Answer, Call, Routes
from tidings.rendering import (
    KEY_PATTERN,
    MAX_KEY_LENGTH,
    MAX_VARIABLES,
    RenderError,
    TemplateError,
    Variable,
    VariableType,
    compile_template,
    render,
)
from tidings.storage import templates as store

routes = Routes("Templates")

Category = Literal["otp", "welcome", "receipt", "alert", "notification", "custom"]
ALIAS_PATTERN = r"^[A-Za-z0-9_-]+$"
MAX_ALIAS_LENGTH = 100
MAX_FROM_LENGTH = 255
TEMPLATE_PATH: dict[str, type] = {"template": str}


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
    if value is not None and ("\n" in value or "\r" in value):
        raise ValueError("must not contain line breaks")
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

    name: str | None = Field(None, min_length=1, max_length=100)
    alias: str | None = Field(
        None, min_length=1, max_length=MAX_ALIAS_LENGTH, pattern=ALIAS_PATTERN
    )
    category: Category | None = None
    from_: str | None = Field(None, alias="from", max_length=MAX_FROM_LENGTH)
    reply_to: str | None = Field(None, max_length=320, json_schema_extra={"format": "email"})
    subject: str | None = Field(None, min_length=1)
    html: str | None = Field(None, min_length=1)
    text: str | None = Field(None, min_length=1)
    variables: list[VariableIn] | None = Field(None, max_length=MAX_VARIABLES)
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


class VariableOut(BaseModel):
    key: str
    type: VariableType
    fallback_value: str | int | float | bool | None


class TemplateVersionOut(BaseModel):
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

    @classmethod
    def of(cls, version: store.TemplateVersion) -> TemplateVersionOut:
        return cls(
            id=version.id,
            team_id=version.team_id,
            template_id=version.template_id,
            version_number=version.version_number,
            subject=version.subject,
            html=version.html,
            variables=[
                VariableOut(key=v.key, type=v.type, fallback_value=v.fallback_value)
                for v in version.variables
            ],
            created_at=version.created_at,
            from_email=version.from_email,
            from_name=version.from_name,
            reply_to_email=version.reply_to_email,
            text=version.text,
            based_on_version_id=version.based_on_version_id,
            change_note=version.change_note,
        )


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


# --- helpers -----------------------------------------------------------------------------


def template_ref(value: str) -> store.TemplateRef:
    """The template a path names: a UUID is an id, anything else an alias."""
    try:
        return store.TemplateRef(id=UUID(value))
    except ValueError:
        pass
    if len(value) > MAX_ALIAS_LENGTH or not value or not _is_alias(value):
        raise bad_request(f"template: {value!r} is neither a template id nor an alias")
    return store.TemplateRef(alias=value)


def _is_alias(value: str) -> bool:
    return all(c.isascii() and (c.isalnum() or c in "_-") for c in value)


def parse_from(value: str) -> tuple[str, str | None]:
    """The address and display name of a ``from`` value, or 400 naming ``from``."""
    try:
        mailbox = parse_mailbox(value, "from")
    except FieldError as error:
        raise bad_request(f"invalid body: {error}") from None
    return mailbox.address, mailbox.name


def build_content(
    *,
    from_: str | None,
    reply_to: str | None,
    subject: str,
    html: str,
    text: str | None,
    variables: tuple[Variable, ...],
) -> store.VersionContent:
    """A version's content, checked as a template (400 naming the field)."""
    from_email, from_name = parse_from(from_) if from_ is not None else (None, None)
    return checked(
        store.VersionContent(
            subject=subject,
            html=html,
            text=text,
            from_email=from_email,
            from_name=from_name,
            reply_to_email=reply_to,
            variables=variables,
        )
    )


def checked(content: store.VersionContent) -> store.VersionContent:
    """``content`` if it compiles as a template, else 400 naming the field."""
    try:
        compile_template(content)
    except TemplateError as error:
        raise bad_request(f"invalid body: {error}") from None
    return content


async def detail(call: Call, template: store.Template) -> TemplateDetail:
    wanted = [template.current_version_id]
    if template.published_version_id is not None:
        wanted.append(template.published_version_id)
    versions = await store.get_versions(call.conn, call.team_id, wanted)
    published = (
        None
        if template.published_version_id is None
        else TemplateVersionOut.of(versions[template.published_version_id])
    )
    return TemplateDetail(
        **TemplateOut.fields_of(template),
        current_version=TemplateVersionOut.of(versions[template.current_version_id]),
        published_version=published,
    )


# --- routes ------------------------------------------------------------------------------


@routes.route(
    "POST", "/templates", summary="Create a template and its first draft version",
    permission="templates:write", body=CreateTemplate, response=TemplateCreated, status=201,
)
async def create_template(call: Call, body: CreateTemplate) -> TemplateCreated:
    content = build_content(
        from_=body.from_,
        reply_to=body.reply_to,
        subject=body.subject,
        html=body.html,
        text=body.text,
        variables=tuple(v.variable() for v in body.variables),
    )
    template_id = await store.create_template(
        call.conn, call.team_id, body.name, body.alias, body.category, content
    )
    return TemplateCreated(id=template_id)


@routes.route(
    "GET", "/templates", summary="List templates", permission="templates:read",
    query=TemplateQuery, response=TemplateList,
)
async def list_templates(call: Call, query: TemplateQuery) -> dict[str, Any]:
    found = await store.list_templates(
        call.conn, call.team_id, query.limit + 1, query.offset,
        category=query.category, search=query.search,
    )
    return page([TemplateOut.of(t) for t in found], query.limit)


@routes.route(
    "GET", "/templates/{template}", summary="Retrieve a template by id or alias",
    permission="templates:read", response=TemplateDetail, path_types=TEMPLATE_PATH,
)
async def get_template(call: Call, template: str) -> TemplateDetail:
    found = await store.get_template(call.conn, call.team_id, template_ref(template))
    if found is None:
        raise not_found("template")
    return await detail(call, found)


@routes.route(
    "PATCH", "/templates/{template}",
    summary="Change a template: every change makes a new draft version",
    permission="templates:write", body=UpdateTemplate, response=TemplateDetail,
    path_types=TEMPLATE_PATH,
)
async def update_template(call: Call, template: str, body: UpdateTemplate) -> TemplateDetail:
    ref = template_ref(template)
    given = body.model_fields_set
    async with call.conn.transaction():
        locked = await store.lock_template(call.conn, call.team_id, ref)
        if locked is None:
            raise not_found("template")
        name = body.name if "name" in given and body.name is not None else locked.name
        alias = body.alias if "alias" in given else locked.alias
        category = body.category if "category" in given else locked.category
        base = (
            await store.get_versions(call.conn, call.team_id, [locked.current_version_id])
        )[locked.current_version_id]
        content = merged_content(base, body)
        updated = await store.add_version(
            call.conn, locked, base, name, alias, category, content, body.change_note
        )
        return await detail(call, updated)


def merged_content(base: store.TemplateVersion, body: UpdateTemplate) -> store.VersionContent:
    """The content of a new version: the body's fields, the rest from ``base``."""
    given = body.model_fields_set
    carried = base.content
    if "from_" in given:
        from_email, from_name = (
            parse_from(body.from_) if body.from_ is not None else (None, None)
        )
    else:
        from_email, from_name = carried.from_email, carried.from_name
    variables = (
        tuple(v.variable() for v in body.variables)
        if "variables" in given and body.variables is not None
        else carried.variables
    )
    return checked(
        store.VersionContent(
            subject=carried.subject if body.subject is None else body.subject,
            html=body.html if "html" in given and body.html is not None else carried.html,
            text=body.text if "text" in given else carried.text,
            from_email=from_email,
            from_name=from_name,
            reply_to_email=body.reply_to if "reply_to" in given else carried.reply_to_email,
            variables=variables,
        )
    )


@routes.route(
    "POST", "/templates/{template}/publish",
    summary="Publish a version (the current draft by default): sends use it",
    permission="templates:write", body=PublishTemplate, body_required=False,
    response=TemplateDetail, path_types=TEMPLATE_PATH,
)
async def publish_template(call: Call, template: str, body: PublishTemplate) -> TemplateDetail:
    ref = template_ref(template)
    published = await store.publish(call.conn, call.team_id, ref, body.version_id)
    if published is None:
        if await store.get_template(call.conn, call.team_id, ref) is None:
            raise not_found("template")
        raise not_found("template version")
    return await detail(call, published)


@routes.route(
    "GET", "/templates/{template}/versions", summary="List a template's versions, newest first",
    permission="templates:read", query=Paging, response=VersionList, path_types=TEMPLATE_PATH,
)
async def list_versions(call: Call, template: str, query: Paging) -> dict[str, Any]:
    found = await store.get_template(call.conn, call.team_id, template_ref(template))
    if found is None:
        raise not_found("template")
    versions = await store.list_versions(
        call.conn, call.team_id, found.id, query.limit + 1, query.offset
    )
    return page([TemplateVersionOut.of(v) for v in versions], query.limit)


@routes.route(
    "GET", "/templates/{template}/versions/{version_id}", summary="Retrieve a template version",
    permission="templates:read", response=TemplateVersionOut, path_types=TEMPLATE_PATH,
)
async def get_version(call: Call, template: str, version_id: UUID) -> TemplateVersionOut:
    version = await store.get_version(call.conn, call.team_id, template_ref(template), version_id)
    if version is None:
        raise not_found("template version")
    return TemplateVersionOut.of(version)


@routes.route(
    "POST", "/templates/{template}/render",
    summary="Render a version with variables, without sending anything",
    permission="templates:read", body=RenderTemplate, body_required=False,
    response=RenderedTemplate, path_types=TEMPLATE_PATH,
)
async def render_template(call: Call, template: str, body: RenderTemplate) -> RenderedTemplate:
    ref = template_ref(template)
    if body.version_id is None:
        version = await store.get_default_version(call.conn, call.team_id, ref)
    else:
        version = await store.get_version(call.conn, call.team_id, ref, body.version_id)
    if version is None:
        raise not_found("template" if body.version_id is None else "template version")
    try:
        rendered = render(version, body.variables)
    except RenderError as error:
        raise unprocessable(str(error)) from None
    return RenderedTemplate(
        subject=rendered.subject,
        html=rendered.html,
        text=rendered.text,
        version_id=version.id,
        version_number=version.version_number,
    )


@routes.route(
    "DELETE", "/templates/{template}", summary="Delete a template and all its versions",
    permission="templates:write", status=204, path_types=TEMPLATE_PATH,
)
async def delete_template(call: Call, template: str) -> Answer:
    if not await store.delete_template(call.conn, call.team_id, template_ref(template)):
        raise not_found("template")
    return Answer(204)
