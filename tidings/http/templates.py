"""Templates over HTTP: immutable numbered versions, publishing, and render previews.

Every ``{template}`` in a path is the template's id or its alias. A change
(PATCH), of the content or of the template's name, alias or category, never
edits a version: it adds one based on the current draft.
Decisions are written up in docs/templates.md; the bodies are in
``tidings.http.template_models``.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from tidings.addresses import parse_mailbox
from tidings.fields import FieldError
from tidings.http.envelope import bad_request, not_found, unprocessable
from tidings.http.paging import Paging, page
from tidings.http.parsing import path_uuid
from tidings.http.routing import Answer, Call, Routes
from tidings.http.template_models import (
    MAX_ALIAS_LENGTH,
    CreateTemplate,
    PublishTemplate,
    RenderedTemplate,
    RenderTemplate,
    TemplateCreated,
    TemplateDetail,
    TemplateList,
    TemplateOut,
    TemplateQuery,
    TemplateVersionOut,
    UpdateTemplate,
    VersionList,
)
from tidings.rendering import RenderError, TemplateError, Variable, compile_template, render
from tidings.storage import templates as store

routes = Routes("Templates", storage_units=True)

TEMPLATE_PATH: dict[str, type] = {"template": str}


# --- helpers -----------------------------------------------------------------------------


def template_ref(value: str) -> store.TemplateRef:
    """The template a path names: a UUID is an id, anything else an alias."""
    if (found := path_uuid(value)) is not None:
        return store.TemplateRef(id=found)
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
    if any(version_id not in versions for version_id in wanted):
        # Versions go only with their template: it was deleted since it was read.
        raise not_found("template")
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
    carried = base
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
