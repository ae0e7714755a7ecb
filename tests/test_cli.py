"""The ``tidings`` command as a user runs it: a real subprocess, or, for a
command that must stop before it opens a database or serves, ``main`` run in
this process with the same environment (``tidings_in_process``); the first
case of each such test, and every bad DATABASE_URL, still a real subprocess.

Every bad setting and every database that cannot be used ends every command
with one line on stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import socket
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from unittest import mock

import pytest

from tidings import __version__, cli
from tidings.cli import parser, where_the_database_is
from tidings.config import Config
from tidings.storage.db import with_database

COMMANDS = {
    "serve": ["serve", "--port", "0"],
    "tokens create": ["tokens", "create", "--team", "acme"],
    "tokens revoke": ["tokens", "revoke", "00000000-0000-0000-0000-000000000000"],
    "contacts import": ["contacts", "import", "contacts.csv", "--team-token", "svc_team_x"],
}


def environment(tmp_path: Path, settings: dict[str, str]) -> dict[str, str]:
    """The command's environment: this one without any TIDINGS_* or DATABASE_*,
    a data directory in ``tmp_path``, then ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIDINGS_", "DATABASE_"))}
    env.update({"TIDINGS_DATA_DIR": str(tmp_path / "data"), **settings})
    return env


def tidings(args: list[str], tmp_path: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidings", *args], env=environment(tmp_path, settings),
        cwd=tmp_path, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )


# How a test runs the command: tidings or tidings_in_process.
Run = Callable[..., subprocess.CompletedProcess[str]]


class NotInProcess(OSError):
    """What opening a database or serving raises under ``tidings_in_process``."""


def _not_in_process(what: str) -> NotInProcess:
    return NotInProcess(f"tidings_in_process: the command got as far as {what}")


def _refuse_database(*args: object, **kwargs: object) -> None:
    raise _not_in_process("opening the database")


async def _refuse_serving(*args: object, **kwargs: object) -> None:
    raise _not_in_process("serving")


def _refuse_workers(*args: object, **kwargs: object) -> None:
    raise _not_in_process("starting workers")


@contextlib.contextmanager
def _logging_kept() -> Iterator[None]:
    """The loggers ``configure_logging`` changes, as they were, afterwards."""
    loggers = [logging.getLogger(name) for name in ("", "tidings", "tidings.access", "pgserver")]
    saved = [(lg, lg.handlers[:], lg.level, lg.propagate, lg.disabled) for lg in loggers]
    try:
        yield
    finally:
        for lg, handlers, level, propagate, disabled in saved:
            for added in lg.handlers:
                if added not in handlers:
                    added.close()
            lg.handlers[:] = handlers
            lg.setLevel(level)
            lg.propagate, lg.disabled = propagate, disabled


def _exit_status(code: object, stderr: io.StringIO) -> int:
    """The exit status of an interpreter ended by ``SystemExit(code)``, as Python
    computes it: None is 0, an integer itself, anything else printed to stderr and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    stderr.write(f"{code}\n")
    return 1


def tidings_in_process(
    args: list[str], tmp_path: Path, **settings: str
) -> subprocess.CompletedProcess[str]:
    """What ``tidings(args, tmp_path, **settings)`` gives, for a command that must
    stop before it opens a database or serves, without starting an interpreter:
    ``tidings.cli.main(args)`` with the same environment, ``tmp_path`` as working
    directory, no stdin, stdout and stderr captured and the exit status Python
    would give (a traceback and 1 for any other exception). For the call only:
    everything is restored after it, logging included.

    Opening the database, serving and starting workers raise ``NotInProcess``
    (an OSError), so a check that comes too late ends the command as a database
    that cannot be reached does, "cannot use the database", never blocking.
    """
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        stack.enter_context(_logging_kept())
        stack.enter_context(mock.patch.dict(os.environ, environment(tmp_path, settings),
                                            clear=True))
        stack.enter_context(contextlib.chdir(tmp_path))
        stack.enter_context(mock.patch.object(cli, "open_database", _refuse_database))
        stack.enter_context(mock.patch.object(cli, "run_until_signal", _refuse_serving))
        stack.enter_context(mock.patch.object(cli, "run_workers", _refuse_workers))
        stack.enter_context(mock.patch.object(sys, "stdin", io.StringIO()))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        try:
            cli.main(args)
            status = 0
        except SystemExit as exit:
            status = _exit_status(exit.code, err)
        except KeyboardInterrupt:
            raise
        except BaseException as error:
            err.write("".join(traceback.format_exception(error)))
            status = 1
    return subprocess.CompletedProcess(
        [sys.executable, "-m", "tidings", *args], status, out.getvalue(), err.getvalue()
    )


def _sets_database_url(case: tuple[object, ...]) -> bool:
    return any(
        value == "DATABASE_URL" or (isinstance(value, dict) and "DATABASE_URL" in value)
        for value in case
    )


def first_in_a_subprocess(cases: Sequence[object]) -> list[tuple[object, ...]]:
    """Parameters with how to run the command put first: ``tidings`` (a real
    subprocess, end to end) for the first case and for every case of a bad
    DATABASE_URL, ``tidings_in_process`` for every other. A DATABASE_URL checked
    too late goes to the database driver, whose real answer is part of what such
    a case sees, and ``tidings_in_process`` never opens a database."""
    found: list[tuple[object, ...]] = []
    for i, case in enumerate(cases):
        values = case if isinstance(case, tuple) else (case,)
        run = tidings if i == 0 or _sets_database_url(values) else tidings_in_process
        found.append((run, *values))
    return found


def assert_one_line_failure(done: subprocess.CompletedProcess[str], *words: str) -> str:
    assert done.returncode == 1, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("tidings: "), lines
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


BAD_SETTINGS = [
    ({"TIDINGS_LOG_LEVEL": "LOUD"}, ("TIDINGS_LOG_LEVEL", "LOUD", "DEBUG")),
    ({"TIDINGS_LOG_FORMAT": "xml"}, ("TIDINGS_LOG_FORMAT", "json")),
    ({"TIDINGS_EMAIL_PROVIDER": "bogus"}, ("TIDINGS_EMAIL_PROVIDER", "bogus", "sandbox")),
    ({"TIDINGS_SMS_PROVIDER": "pigeon"}, ("TIDINGS_SMS_PROVIDER", "pigeon")),
    ({"TIDINGS_DB_POOL_SIZE": "many"}, ("TIDINGS_DB_POOL_SIZE", "integer")),
    ({"TIDINGS_SHUTDOWN_GRACE_SECONDS": "-1"}, ("TIDINGS_SHUTDOWN_GRACE_SECONDS",)),
    ({"DATABASE_URL": "mysql://root@localhost/tidings"}, ("DATABASE_URL", "postgresql://")),
]


@pytest.mark.parametrize(("run", "settings", "words"), first_in_a_subprocess(BAD_SETTINGS))
def test_a_bad_setting_is_one_line_and_exit_1(
    run: Run, settings: dict[str, str], words: tuple[str, ...], tmp_path: Path
) -> None:
    assert_one_line_failure(run(COMMANDS["tokens create"], tmp_path, **settings), *words)


@pytest.mark.parametrize(
    ("run", "command"), first_in_a_subprocess(["serve", "tokens revoke", "contacts import"])
)
def test_every_command_checks_the_settings(run: Run, command: str, tmp_path: Path) -> None:
    done = run(COMMANDS[command], tmp_path, TIDINGS_LOG_LEVEL="LOUD")
    assert_one_line_failure(done, "TIDINGS_LOG_LEVEL")


UNREACHABLE = [
    ("postgresql://nope/tidings", "postgresql://nope/tidings"),
    ("postgresql://127.0.0.1:1/tidings", "Connect call failed"),
]


@pytest.mark.parametrize(
    ("command", "url", "word"),
    [("serve", *UNREACHABLE[0]), ("tokens create", *UNREACHABLE[1]),
     ("tokens revoke", *UNREACHABLE[0]), ("serve", *UNREACHABLE[1])],
)
def test_an_unreachable_database_is_one_line_and_exit_1(
    command: str, url: str, word: str, tmp_path: Path
) -> None:
    line = assert_one_line_failure(
        tidings(COMMANDS[command], tmp_path, DATABASE_URL=url), "cannot use the database", word
    )
    assert "DATABASE_URL" in line


def test_the_database_is_named_as_given_without_its_password() -> None:
    shown = {
        # An empty authority: the "//" stays.
        "postgresql:///tidings?host=/nonexistent": "postgresql:///tidings?host=/nonexistent",
        "postgresql://": "postgresql://",
        "postgresql://app:s3cret@db.example:5433/tidings": "postgresql://db.example:5433/tidings",
    }
    for url, expected in shown.items():
        assert where_the_database_is(Config(database_url=url)) == f"{expected} (DATABASE_URL)"


def test_a_missing_database_is_one_line_and_exit_1(pg_admin_url: str, tmp_path: Path) -> None:
    url = with_database(pg_admin_url, "no_such_database")
    done = tidings(COMMANDS["tokens create"], tmp_path, DATABASE_URL=url)
    assert_one_line_failure(done, "cannot use the database", "no_such_database")


def test_a_password_is_not_shown(tmp_path: Path) -> None:
    done = tidings(COMMANDS["tokens create"], tmp_path,
                   DATABASE_URL="postgresql://app:s3cret@127.0.0.1:1/tidings")
    line = assert_one_line_failure(done, "127.0.0.1:1")
    assert "s3cret" not in line


def test_version_and_help(tmp_path: Path) -> None:
    done = tidings(["--version"], tmp_path)
    assert done.returncode == 0
    assert done.stdout.strip() == f"tidings {__version__}"
    done = tidings(["--help"], tmp_path)
    assert done.returncode == 0
    assert "--version" in done.stdout and "`" not in done.stdout


HELP = [
    [], ["serve"], ["tokens"], ["tokens", "create"], ["tokens", "revoke"], ["contacts"],
    ["contacts", "import"],
]


@pytest.mark.parametrize("command", HELP, ids=lambda c: " ".join(c) or "tidings")
def test_help_explains_every_option_without_markup(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parser().parse_args([*command, "--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    assert "`" not in shown, shown
    # Every option and argument of the command carries a help text.
    found = parser()
    for word in command:
        sub = next(a for a in found._actions if a.__class__.__name__ == "_SubParsersAction")
        found = sub.choices[word]  # type: ignore[attr-defined]
    for action in found._actions:
        assert action.help, (command, action.option_strings or action.dest)


def test_a_port_in_use_is_one_line_naming_the_port(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = tidings(["serve", "--host", "127.0.0.1", "--port", str(port)], tmp_path)
    # serve logs its start (the migrations) before it binds the port.
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line == f"tidings: cannot listen on 127.0.0.1:{port}: Address already in use", line


def test_a_closed_output_is_said_so_not_taken_for_a_database_failure(tmp_path: Path) -> None:
    """``tidings tokens create | true``: what would read the line has gone."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tidings", "tokens", "create", "--team", "piped"],
            env=environment(tmp_path, {}), cwd=tmp_path, stdout=write_end,
            stderr=subprocess.PIPE, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 1
    assert done.stderr.strip() == "tidings: the output was closed before it was all written"
