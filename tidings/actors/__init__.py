"""The actor runtime and the actors of Tidings.

Every long-lived piece of work (an idempotency shard, a webhook endpoint, a
broadcast) is an actor: a trio task that owns its entity alone and is reached
only through messages in a bounded mailbox. See ``supervisor.py``.
"""

from tidings.actors.mailbox import ActorError, ActorStopped, Mailbox, MailboxFull, Reply
from tidings.actors.supervisor import Actor, Backoff, Handle, Supervisor, open_supervisor

__all__ = [
    "Actor",
    "ActorError",
    "ActorStopped",
    "Backoff",
    "Handle",
    "Mailbox",
    "MailboxFull",
    "Reply",
    "Supervisor",
    "open_supervisor",
]
