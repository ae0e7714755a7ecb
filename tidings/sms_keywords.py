"""What an inbound text message asks for (CONTRACT §6): the keywords carriers
and Twilio honour.

A reply is a keyword when its whole text, trimmed, without trailing
punctuation and in any case, is one: ``stop.`` and `` Stop `` are, ``stop
it`` is not (a sentence is not an instruction). Pure: no I/O.
"""

from __future__ import annotations

from typing import Literal

Action = Literal["opt_out", "opt_in", "help"]

OPT_OUT = frozenset({"STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT"})
OPT_IN = frozenset({"START", "YES", "UNSTOP"})
HELP = frozenset({"HELP", "INFO"})


def keyword_action(body: str) -> Action | None:
    """The action the reply ``body`` asks for, if it is a keyword."""
    word = body.strip().rstrip(".!?").strip().upper()
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
