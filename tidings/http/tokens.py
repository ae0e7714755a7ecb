"""Team tokens over HTTP: create, list, revoke (tokens:manage and a step-up token)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, Field, field_validator

from tidings.http.envelope import ApiError, not_found
from tidings.http.models import RequestBody
from tidings.http.paging import Paging, page
from tidings.http.routing import Answer, Call, Routes
from tidings.permissions import ALL_PERMISSIONS, unknown_permissions
from tidings.storage import tokens as store

routes = Routes("Tokens")

TEN_YEARS = 10 * 365 * 86400


class CreateToken(RequestBody):
    name: str | None = Field(None, min_length=1, max_length=100)
    permissions: list[str] = Field(
        min_length=1, description=f"Any of: {', '.join(ALL_PERMISSIONS)}"
    )
    expires_in: int | None = Field(None, ge=1, le=TEN_YEARS, description="Seconds")
    step_up: bool = Field(
        False, description="Must be false: step-up tokens come only from the CLI"
    )

    @field_validator("permissions")
    @classmethod
    def known(cls, value: list[str]) -> list[str]:
        unknown = unknown_permissions(value)
        if unknown:
            raise ValueError(f"unknown permissions: {', '.join(unknown)}")
        return value


class TokenOut(BaseModel):
    object: Literal["token"] = "token"
    id: UUID
    team_id: UUID
    name: str | None
    prefix: str = Field(description="The first characters of the secret")
    permissions: list[str]
    step_up: bool
    status: Literal["active", "expired", "revoked"]
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None

    @classmethod
    def of(cls, token: store.Token) -> TokenOut:
        status: Literal["active", "expired", "revoked"] = (
            "revoked" if token.revoked_at else "expired" if token.expired else "active"
        )
        return cls(
            id=token.id,
            team_id=token.team_id,
            name=token.name,
            prefix=token.prefix,
            permissions=list(token.permissions),
            step_up=token.step_up,
            status=status,
            created_at=token.created_at,
            expires_at=token.expires_at,
            revoked_at=token.revoked_at,
        )


class CreatedToken(TokenOut):
    token: str = Field(description="The secret: shown only in this response")


class TokenList(BaseModel):
    object: Literal["list"] = "list"
    data: list[TokenOut]
    has_more: bool


@routes.route(
    "POST", "/tokens", summary="Create a team token", permission="tokens:manage",
    step_up=True, body=CreateToken, response=CreatedToken, status=201, secret_response=True,
)
async def create_token(call: Call, body: CreateToken) -> CreatedToken:
    if body.step_up:
        # Otherwise a step-up token could renew itself forever.
        raise ApiError(
            403, "FORBIDDEN", "step_up: step-up tokens are created only with the tidings CLI"
        )
    beyond = sorted(set(body.permissions) - set(call.token.permissions))
    if beyond:
        raise ApiError(
            403, "FORBIDDEN", f"cannot grant permissions this token lacks: {', '.join(beyond)}"
        )
    token, secret = await store.create_token(
        call.conn, call.team_id, body.permissions,
        name=body.name, expires_in=body.expires_in, step_up=body.step_up,
    )
    return CreatedToken(**TokenOut.of(token).model_dump(), token=secret)


@routes.route(
    "GET", "/tokens", summary="List the team's tokens", permission="tokens:manage",
    step_up=True, query=Paging, response=TokenList,
)
async def list_tokens(call: Call, query: Paging) -> dict[str, Any]:
    found = await store.list_tokens(call.conn, call.team_id, query.limit + 1, query.offset)
    return page([TokenOut.of(token) for token in found], query.limit)


@routes.route(
    "DELETE", "/tokens/{token_id}", summary="Revoke a token", permission="tokens:manage",
    step_up=True, status=204,
)
async def revoke_token(call: Call, token_id: UUID) -> Answer:
    if await store.revoke_token(call.conn, token_id, call.team_id) is None:
        raise not_found("token")
    # The NOTIFY reaches this process's listener a moment later; the next
    # request must already be refused.
    call.after_commit(lambda: call.service.tokens.forget(token_id))
    return Answer(204)
