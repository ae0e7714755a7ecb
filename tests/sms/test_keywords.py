"""Which replies are keywords (CONTRACT §6, and Twilio's default opt-out words)."""

from __future__ import annotations

import pytest

from tidings.sms_keywords import keyword_action


@pytest.mark.parametrize(("body", "action"), [
    ("STOP", "opt_out"), (" stop. ", "opt_out"), ("Stop;", "opt_out"), ("stop,", "opt_out"),
    ("ＳＴＯＰ", "opt_out"), ("ＳＴＯＰ。", "opt_out"), ("STOP\u200b", "opt_out"),
    ("\ufeffstop", "opt_out"), ("Stop\u00ad", "opt_out"), ("S\u00adTOP", "opt_out"),
    ("\u200estop\u200f", "opt_out"), ("\u2066STOP\u2069", "opt_out"),
    ("revoke", "opt_out"), ("OptOut!", "opt_out"),
    ("unsubscribe", "opt_out"), ("quit", "opt_out"),
    ("start", "opt_in"), ("Yes!", "opt_in"), ("unstop", "opt_in"),
    ("help?", "help"), ("INFO", "help"),
    ("please stop", None), ("stop it", None), ("stopp", None), ("", None), ("opt out", None),
])
def test_a_reply_is_a_keyword_when_its_whole_text_is_one(body: str, action: str | None) -> None:
    assert keyword_action(body) == action
