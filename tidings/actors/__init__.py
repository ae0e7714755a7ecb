"""The actor runtime and the actors of Tidings.

Every long-lived piece of work (an idempotency shard, a webhook endpoint, a
broadcast) is an actor: a trio task that owns its entity alone and is reached
only through messages in a bounded mailbox. See ``runtime.py`` for how the
children of a process are registered, ``supervisor.py`` and ``singleton.py``
for how they are supervised, and ``duework.py`` for durable due work.
"""

from tidings.actors.mailbox import ActorError, ActorStopped, Mailbox, MailboxFull, Reply
from tidings.actors.policy import Backoff, Intensity
from tidings.actors.singleton import Singleton
from tidings.actors.supervisor import Actor, Handle, Supervisor, open_supervisor

__all__ = [
    "Actor",
    "ActorError",
    "ActorStopped",
    "Backoff",
    "Handle",
    "Intensity",
    "Mailbox",
    "MailboxFull",
    "Reply",
    "Singleton",
    "Supervisor",
    "open_supervisor",
]
