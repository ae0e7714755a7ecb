"""What an inbound text message asks for (CONTRACT §6): the keywords carriers
and Twilio honour.

A reply is a keyword when its whole text, trimmed, without trailing
punctuation, in any case and in any width (``ＳＴＯＰ`` from a phone's
full-width keyboard), is one: ``stop.``, ``Stop;`` and `` Stop `` are,
``stop it`` is not (a sentence is not an instruction). The opt-out words
are CONTRACT §6's and the two more Twilio honours by default (``REVOKE``,
``OPTOUT``): a number Twilio blocks is one Tidings must not text either.
Pure: no I/O.
"""

from __future__ import annotations

import unicodedata
from typing import Literal

Action = Literal["opt_out", "opt_in", "help"]

OPT_OUT = frozenset({
    "STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT", "REVOKE", "OPTOUT",
})
# Trailing characters a keyword may carry (with the ideographic full stops,
# which NFKC leaves as they are). Invisible ones a keyboard or a paste may
# add (zero-width spaces and joiners, the soft hyphen, direction marks: the
# characters Unicode calls "format", Cf) are dropped wherever they are.
TRAILING = ".!?,;:\u3002\uff61"
OPT_IN = frozenset({"START", "YES", "UNSTOP"})
HELP = frozenset({"HELP", "INFO"})


def keyword_action(body: str) -> Action | None:
    """The action the reply ``body`` asks for, if it is a keyword."""
    text = "".join(
        c for c in unicodedata.normalize("NFKC", body) if unicodedata.category(c) != "Cf"
    )
    word = text.strip().rstrip(TRAILING).strip().upper()
    if word in OPT_OUT:
        return "opt_out"
    if word in OPT_IN:
        return "opt_in"
    if word in HELP:
        return "help"
    return None


def help_text(template: str, team: str) -> str:
    """The answer to HELP: the setting, with ``{team}`` replaced by the team's name."""
    return template.replace("{team}", team)
