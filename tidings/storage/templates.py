"""Templates of a team and their versions.

Versions are immutable: there is no UPDATE of ``template_versions`` here, and
a trigger refuses one from anywhere. A change is a new version, numbered one
above the template's current version, inserted while the template's row is
locked. A template names two of its versions: the current one (the newest,
which changes build on) and the published one (which sends use).

A template is found by id or by alias (``TemplateRef``): queries take both,
one of them NULL.
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from tidings.rendering import Variable
from tidings.storage.connection import Connection, Row, returned
from tidings.storage.errors import unique

TEMPLATE_COLUMNS = """
t.id, t.team_id, t.name, t.alias, t.category, t.current_version_id,
cv.version_number AS current_version_number, t.published_version_id,
pv.version_number AS published_version_number, t.published_at, t.created_at, t.updated_at
"""
TEMPLATE_JOINS = """
JOIN template_versions cv ON cv.id = t.current_version_id
LEFT JOIN template_versions pv ON pv.id = t.published_version_id
"""
VERSION_COLUMNS = """
v.id, v.team_id, v.template_id, v.version_number, v.subject, v.html, v.text, v.from_email,
v.from_name, v.reply_to_email, v.variables, v.based_on_version_id, v.change_note, v.created_at
"""
BY_REF = "t.team_id = $1 AND (t.id = $2 OR t.alias = $3)"

# A template and its first version, in one statement (the foreign keys from
# the template to its versions are deferred).
INSERT_TEMPLATE = """
WITH ids AS (SELECT gen_random_uuid() AS template_id, gen_random_uuid() AS version_id),
template AS (
    INSERT INTO templates (id, team_id, name, alias, category, current_version_id)
    SELECT template_id, $1, $2, $3, $4, version_id FROM ids
    RETURNING id
),
version AS (
    INSERT INTO template_versions (id, team_id, template_id, version_number, subject, html,
                                   text, from_email, from_name, reply_to_email, variables)
    SELECT version_id, $1, template_id, 1, $5, $6, $7, $8, $9, $10, $11::jsonb FROM ids
    RETURNING id
)
SELECT template.id FROM template, version
"""

SELECT_TEMPLATE = f"SELECT {TEMPLATE_COLUMNS} FROM templates t {TEMPLATE_JOINS} WHERE {BY_REF}"

# The template's row stays locked until the transaction ends: versions of one
# template are numbered one at a time. Only the template's own columns: a
# query that waited for the lock sees the row as the other transaction left
# it, but joined rows as they were when it started.
LOCK_TEMPLATE = f"""
SELECT t.id, t.name, t.alias, t.category, t.current_version_id FROM templates t
WHERE {BY_REF}
FOR UPDATE
"""

SELECT_TEMPLATES = f"""
SELECT {TEMPLATE_COLUMNS} FROM templates t {TEMPLATE_JOINS}
WHERE t.team_id = $1
  AND ($2::text IS NULL OR t.category = $2)
  AND ($3::text IS NULL OR t.name ILIKE $3 ESCAPE '\\' OR t.alias ILIKE $3 ESCAPE '\\')
ORDER BY t.created_at DESC, t.id DESC
LIMIT $4 OFFSET $5
"""

# A new version based on the current one, which it replaces as current.
INSERT_VERSION = """
WITH v AS (
    INSERT INTO template_versions (team_id, template_id, version_number, subject, html, text,
                                   from_email, from_name, reply_to_email, variables,
                                   based_on_version_id, change_note)
    VALUES ($1, $2, $3, $7, $8, $9, $10, $11, $12, $13::jsonb, $14, $15)
    RETURNING id, version_number
),
t AS (
    UPDATE templates
    SET current_version_id = (SELECT id FROM v), name = $4, alias = $5, category = $6,
        updated_at = now()
    WHERE id = $2
    RETURNING *
)
SELECT t.id, t.team_id, t.name, t.alias, t.category, t.current_version_id,
       v.version_number AS current_version_number, t.published_version_id,
       pv.version_number AS published_version_number, t.published_at, t.created_at,
       t.updated_at
FROM t CROSS JOIN v
LEFT JOIN template_versions pv ON pv.id = t.published_version_id
"""

# Publishing the version already published keeps its published_at. Run
# after ``lock_template``: alone, a publish that waited for a PATCH in flight
# would recheck the template's new row against the version it had joined
# before (the old current one), match nothing and answer "not found".
PUBLISH = f"""
WITH t AS (
    UPDATE templates t
    SET published_version_id = v.id,
        published_at = CASE WHEN t.published_version_id = v.id THEN t.published_at
                            ELSE now() END,
        updated_at = now()
    FROM template_versions v
    WHERE {BY_REF} AND v.template_id = t.id AND v.id = COALESCE($4, t.current_version_id)
    RETURNING t.*
)
SELECT {TEMPLATE_COLUMNS} FROM t {TEMPLATE_JOINS}
"""

SELECT_VERSIONS_BY_ID = f"""
SELECT {VERSION_COLUMNS} FROM template_versions v WHERE v.team_id = $1 AND v.id = ANY($2::uuid[])
"""

SELECT_VERSIONS = f"""
SELECT {VERSION_COLUMNS} FROM template_versions v
WHERE v.team_id = $1 AND v.template_id = $2
ORDER BY v.version_number DESC
LIMIT $3 OFFSET $4
"""

SELECT_VERSION = f"""
SELECT {VERSION_COLUMNS} FROM templates t JOIN template_versions v ON v.template_id = t.id
WHERE {BY_REF} AND v.id = $4
"""

# The version a render uses by default: the published one, else the current draft.
SELECT_DEFAULT_VERSION = f"""
SELECT {VERSION_COLUMNS} FROM templates t
JOIN template_versions v ON v.id = COALESCE(t.published_version_id, t.current_version_id)
WHERE {BY_REF}
"""

DELETE_TEMPLATE = f"DELETE FROM templates t WHERE {BY_REF} RETURNING t.id"


@dataclass(frozen=True)
class TemplateRef:
    """A template named in a path: by id or by alias (exactly one is set)."""

    id: UUID | None = None
    alias: str | None = None

    @property
    def args(self) -> tuple[UUID | None, str | None]:
        return self.id, self.alias


@dataclass(frozen=True)
class Template:
    id: UUID
    team_id: UUID
    name: str
    alias: str | None
    category: str | None
    current_version_id: UUID
    current_version_number: int
    published_version_id: UUID | None
    published_version_number: int | None
    published_at: datetime | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Row) -> Template:
        return cls(**dict(row))


@dataclass(frozen=True)
class Locked:
    """A template whose row the caller's transaction has locked."""

    id: UUID
    name: str
    alias: str | None
    category: str | None
    current_version_id: UUID


@dataclass(frozen=True)
class VersionContent:
    """What a version holds, before it is stored."""

    subject: str
    html: str
    text: str | None
    from_email: str | None
    from_name: str | None
    reply_to_email: str | None
    variables: tuple[Variable, ...]


@dataclass(frozen=True)
class TemplateVersion(VersionContent):
    """A stored version: its content and what names it."""

    id: UUID
    team_id: UUID
    template_id: UUID
    version_number: int
    based_on_version_id: UUID | None
    change_note: str | None
    created_at: datetime

    @classmethod
    def from_row(cls, row: Row) -> TemplateVersion:
        fields = dict(row)
        fields["variables"] = variables_from_json(fields["variables"])
        return cls(**fields)


def variables_to_json(variables: tuple[Variable, ...]) -> str:
    return json.dumps(
        [{"key": v.key, "type": v.type, "fallback_value": v.fallback_value} for v in variables]
    )


def variables_from_json(raw: str) -> tuple[Variable, ...]:
    return tuple(
        Variable(key=item["key"], type=item["type"], fallback_value=item["fallback_value"])
        for item in json.loads(raw)
    )


def _content_args(content: VersionContent) -> tuple[object, ...]:
    return (
        content.subject,
        content.html,
        content.text,
        content.from_email,
        content.from_name,
        content.reply_to_email,
        variables_to_json(content.variables),
    )


def _unique_alias(alias: str | None) -> AbstractContextManager[None]:
    return unique("alias", f"the team has a template with alias {alias!r} already")


def like_pattern(search: str) -> str:
    """An ILIKE pattern matching ``search`` anywhere, wildcards in it taken literally."""
    escaped = search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


async def create_template(
    conn: Connection,
    team_id: UUID,
    name: str,
    alias: str | None,
    category: str | None,
    content: VersionContent,
) -> UUID:
    """Insert a template and its first version (number 1, current, unpublished).

    Raises Duplicate if the team has a template with this alias.
    """
    with _unique_alias(alias):
        template_id: UUID = await conn.fetchval(
            INSERT_TEMPLATE, team_id, name, alias, category, *_content_args(content)
        )
    return template_id


async def get_template(conn: Connection, team_id: UUID, ref: TemplateRef) -> Template | None:
    row = await conn.fetchrow(SELECT_TEMPLATE, team_id, *ref.args)
    return None if row is None else Template.from_row(row)


async def lock_template(conn: Connection, team_id: UUID, ref: TemplateRef) -> Locked | None:
    """Lock the template's row until the caller's transaction ends; None if not found.

    Read its current version after this (in READ COMMITTED, a later statement
    sees what a transaction that held the lock before committed).
    """
    row = await conn.fetchrow(LOCK_TEMPLATE, team_id, *ref.args)
    return None if row is None else Locked(**dict(row))


async def list_templates(
    conn: Connection,
    team_id: UUID,
    limit: int,
    offset: int,
    *,
    category: str | None = None,
    search: str | None = None,
) -> list[Template]:
    pattern = None if search is None else like_pattern(search)
    rows = await conn.fetch(SELECT_TEMPLATES, team_id, category, pattern, limit, offset)
    return [Template.from_row(row) for row in rows]


async def add_version(
    conn: Connection,
    locked: Locked,
    base: TemplateVersion,
    name: str,
    alias: str | None,
    category: str | None,
    content: VersionContent,
    change_note: str | None,
) -> Template:
    """Add a version based on ``base``, the current version of ``locked``, and
    make it current; set the template's own fields too.

    Raises Duplicate for a taken alias.
    """
    with _unique_alias(alias):
        row = await conn.fetchrow(
            INSERT_VERSION,
            base.team_id,
            locked.id,
            base.version_number + 1,
            name,
            alias,
            category,
            *_content_args(content),
            base.id,
            change_note,
        )
    return Template.from_row(returned(row))


async def publish(
    conn: Connection, team_id: UUID, ref: TemplateRef, version_id: UUID | None
) -> Template | None:
    """Publish a version of the template (its current one by default).

    None if there is no such template, or no such version of it.
    """
    async with conn.transaction():
        # A PATCH in flight commits its new current version first.
        await lock_template(conn, team_id, ref)
        row = await conn.fetchrow(PUBLISH, team_id, *ref.args, version_id)
    return None if row is None else Template.from_row(row)


async def get_versions(
    conn: Connection, team_id: UUID, version_ids: list[UUID]
) -> dict[UUID, TemplateVersion]:
    rows = await conn.fetch(SELECT_VERSIONS_BY_ID, team_id, version_ids)
    return {row["id"]: TemplateVersion.from_row(row) for row in rows}


async def list_versions(
    conn: Connection, team_id: UUID, template_id: UUID, limit: int, offset: int
) -> list[TemplateVersion]:
    """Versions of a template, newest first."""
    rows = await conn.fetch(SELECT_VERSIONS, team_id, template_id, limit, offset)
    return [TemplateVersion.from_row(row) for row in rows]


async def get_version(
    conn: Connection, team_id: UUID, ref: TemplateRef, version_id: UUID
) -> TemplateVersion | None:
    """A version of the template, or None if either is not the team's."""
    row = await conn.fetchrow(SELECT_VERSION, team_id, *ref.args, version_id)
    return None if row is None else TemplateVersion.from_row(row)


async def get_default_version(
    conn: Connection, team_id: UUID, ref: TemplateRef
) -> TemplateVersion | None:
    """The version a render uses by default: the published one, else the current draft."""
    row = await conn.fetchrow(SELECT_DEFAULT_VERSION, team_id, *ref.args)
    return None if row is None else TemplateVersion.from_row(row)


async def delete_template(conn: Connection, team_id: UUID, ref: TemplateRef) -> bool:
    """Delete a template and all its versions; False if the team has no such template."""
    return await conn.fetchval(DELETE_TEMPLATE, team_id, *ref.args) is not None
