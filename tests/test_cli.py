"""The ``tidings`` command as a user runs it: a real subprocess each time.

Every bad setting and every database that cannot be used ends every command
with one line on stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tidings import __version__
from tidings.cli import parser
from tidings.storage.db import with_database

COMMANDS = {
    "serve": ["serve", "--port", "0"],
    "tokens create": ["tokens", "create", "--team", "acme"],
    "tokens revoke": ["tokens", "revoke", "00000000-0000-0000-0000-000000000000"],
    "contacts import": ["contacts", "import", "contacts.csv", "--team-token", "svc_team_x"],
}


def tidings(args: list[str], tmp_path: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIDINGS_", "DATABASE_"))}
    env.update({"TIDINGS_DATA_DIR": str(tmp_path / "data"), **settings})
    return subprocess.run(
        [sys.executable, "-m", "tidings", *args], env=env, cwd=tmp_path,
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )


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


@pytest.mark.parametrize(("settings", "words"), BAD_SETTINGS)
def test_a_bad_setting_is_one_line_and_exit_1(
    settings: dict[str, str], words: tuple[str, ...], tmp_path: Path
) -> None:
    assert_one_line_failure(tidings(COMMANDS["tokens create"], tmp_path, **settings), *words)


@pytest.mark.parametrize("command", ["serve", "tokens revoke", "contacts import"])
def test_every_command_checks_the_settings(command: str, tmp_path: Path) -> None:
    done = tidings(COMMANDS[command], tmp_path, TIDINGS_LOG_LEVEL="LOUD")
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
