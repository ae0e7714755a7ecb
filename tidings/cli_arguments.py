"""The types of the ``tidings`` command's options: numbers spelled as the
settings' are (ASCII digits, an optional sign; ``tidings.config_values``),
each refused with a message argparse shows beside the option's name."""

from __future__ import annotations

import argparse

from tidings.config_values import INTEGER, MAX_BIGINT, NUMBER


def whole_number(raw: str) -> int:
    """An option's whole number, spelled as the settings' are (ASCII digits,
    an optional sign: not ``1_000`` nor other scripts' digits, which ``int``
    takes)."""
    if not INTEGER.fullmatch(raw):
        raise argparse.ArgumentTypeError(f"must be a whole number, not {raw!r}")
    return int(raw)


def decimal_number(raw: str) -> float:
    """An option's number of seconds, spelled as the settings' are."""
    if not NUMBER.fullmatch(raw):
        raise argparse.ArgumentTypeError(f"must be a number, not {raw!r}")
    return float(raw)


def quota_limit(raw: str) -> int | None:
    """A quota option's value: N >= 0 (0: unlimited) or ``default`` (None)."""
    if raw.strip().lower() == "default":
        return None
    if not INTEGER.fullmatch(raw):
        message = f"must be a whole number or 'default', not {raw!r}"
        raise argparse.ArgumentTypeError(message)
    value = int(raw)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (unlimited) or more, not {value}")
    if value > MAX_BIGINT:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_BIGINT}, not {value}")
    return value


def port_number(raw: str) -> int:
    """``--port``: 0 (any free port) to 65535."""
    if not INTEGER.fullmatch(raw):
        raise argparse.ArgumentTypeError(f"must be a port number, not {raw!r}")
    value = int(raw)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0 to 65535, not {value}")
    return value
