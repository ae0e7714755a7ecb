"""The event types Tidings emits, with what each one means."""

from __future__ import annotations

TEST_EVENT = "webhook.test"

EVENT_TYPES: dict[str, str] = {
    "message.scheduled": "The email was accepted and waits for its scheduled_at.",
    "message.queued": "The message was accepted and waits to be sent.",
    "message.sent": "The message was handed to the provider.",
    "message.delivered": (
        "The message was delivered: confirmed on the device or by the receiving mail server."
    ),
    "message.delivery_delayed": "Delivery is delayed; the provider keeps trying.",
    "message.bounced": "The email bounced: an invalid address or a full mailbox.",
    "message.complained": "The recipient marked the email as spam.",
    "message.failed": "The provider rejected the message or could not route it.",
    "message.undelivered": "The carrier could not deliver the SMS to the device.",
    "message.canceled": "A scheduled message was canceled before it was sent.",
    "message.suppressed": (
        "A recipient is on the team's suppression list: the email is not sent to it."
    ),
    "broadcast.sent": "Every eligible contact of the broadcast has been queued.",
    "broadcast.failed": "The broadcast could not go on.",
    TEST_EVENT: "A test event sent to one endpoint on request, to confirm delivery works.",
}

# What an endpoint may subscribe to: any type, or every type.
ALL_EVENTS = "*"
