"""The SMS message as every SMS route shows it (the spec's SMS message)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, Field

from tidings.providers.sms import SmsStatus
from tidings.storage.sms import Sms

# The region of a number no country has (+800, +882...): UN M.49 "World",
# as libphonenumber names it, so that ``country`` is always a string.
NON_GEOGRAPHIC = "001"


class Destination(BaseModel):
    country: str = Field(
        description="ISO 3166-1 alpha-2 of the recipient's number; 001 (UN M.49: the world) "
        "for a non-geographic number such as +800"
    )


class Failure(BaseModel):
    code: str | None
    message: str | None


class SmsOut(BaseModel):
    object: Literal["sms"] = "sms"
    id: UUID
    to: str = Field(description="E.164")
    from_: str = Field(serialization_alias="from")
    body: str
    last_event: SmsStatus = Field(description="The normalized status")
    destination: Destination
    segments: int
    created_at: datetime
    updated_at: datetime
    message_id: str | None = Field(description="The provider's message id")
    metadata: dict[str, Any] | None
    scheduled_at: datetime | None
    failure: Failure | None
    submitted_at: datetime | None
    delivered_at: datetime | None

    @classmethod
    def of(cls, sms: Sms) -> SmsOut:
        failed = sms.failure_code is not None or sms.failure_message is not None
        return cls(
            id=sms.id, to=sms.to_number, from_=sms.from_sender, body=sms.body,
            last_event=sms.status,  # type: ignore[arg-type]
            destination=Destination(country=sms.country or NON_GEOGRAPHIC),
            segments=sms.segments,
            created_at=sms.created_at, updated_at=sms.updated_at, message_id=sms.message_id,
            metadata=sms.metadata, scheduled_at=sms.scheduled_at,
            failure=Failure(code=sms.failure_code, message=sms.failure_message)
            if failed else None,
            submitted_at=sms.submitted_at, delivered_at=sms.delivered_at,
        )

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)
