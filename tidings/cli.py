"""The ``tidings`` command: serve, bootstrap or revoke credentials, import contacts.

Every bad setting, and a database that cannot be reached or used, ends the
command with one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import math
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from uuid import UUID

import asyncpg
import trio

from tidings import PARENT_ENV, __version__, importing
from tidings.app import serve
from tidings.cli_arguments import decimal_number, port_number, quota_limit, whole_number
from tidings.config import Config, SettingError
from tidings.config_values import shown_url
from tidings.http.tokens import TEN_YEARS
from tidings.logging_setup import configure_logging
from tidings.permissions import ALL_PERMISSIONS, unknown_permissions
from tidings.storage import quotas as quota_store
from tidings.storage import tokens as token_store
from tidings.storage.db import open_database
from tidings.workers import (
    MAX_WORKERS,
    resolve_checked_url,
    run_workers,
    stop_signals,
    watch_parent,
)

log = logging.getLogger("tidings")

# After the grace for requests in flight, what the actors get to stop.
ACTOR_STOP_SECONDS = 5.0

DESCRIPTION = (
    "Tidings: transactional email and SMS, templates, contacts, broadcasts and signed "
    "webhooks. Settings are environment variables (see the README)."
)


async def run_until_signal(
    config: Config, host: str, port: int, reuse_port: bool = False, *,
    check_limit: bool = False,
) -> None:
    """Serve until a signal; ``check_limit``: first ``check_connections``."""
    stop = trio.Event()

    async def watch_signals(cancel_scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in stop_signals(signals):
                if stop.is_set():
                    log.warning("second signal: stopping now")
                    cancel_scope.cancel()
                    return
                log.info(
                    "%s received: draining; requests in flight get up to %gs",
                    signal.Signals(signum).name, config.shutdown_grace_seconds,
                )
                stop.set()
                cancel_scope.deadline = (
                    trio.current_time() + config.shutdown_grace_seconds + ACTOR_STOP_SECONDS
                )

    with trio.CancelScope() as everything:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_signals, everything)
            nursery.start_soon(watch_parent, stop)
            if check_limit:
                await resolve_checked_url(config, 1)
            await serve(config, host, port, shutdown_trigger=stop.wait, reuse_port=reuse_port)
            nursery.cancel_scope.cancel()
    if everything.cancelled_caught and trio.current_time() >= everything.deadline:
        log.warning("shutdown deadline reached: work still running was cancelled")
    log.info("stopped")


async def create_token(config: Config, args: argparse.Namespace) -> dict[str, str]:
    permissions = (
        list(ALL_PERMISSIONS)
        if args.all or args.permissions is None
        else [p.strip() for p in args.permissions.split(",") if p.strip()]
    )
    unknown = unknown_permissions(permissions)
    if unknown or not permissions:
        raise SystemExit(
            f"tidings: unknown permissions: {', '.join(unknown) or '(none given)'}; "
            f"known: {', '.join(ALL_PERMISSIONS)}"
        )
    async with open_database(config) as db, db.transaction() as conn:
        team_id = await token_store.ensure_team(conn, args.team)
        token, secret = await token_store.create_token(
            conn, team_id, permissions, expires_in=args.expires_in, step_up=args.step_up
        )
    return {"team_id": str(team_id), "token_id": str(token.id), "token": secret}


async def revoke_token(config: Config, token_id: UUID) -> dict[str, str]:
    async with open_database(config) as db, db.acquire() as conn:
        token = await token_store.revoke_token(conn, token_id)
    if token is None or token.revoked_at is None:
        raise SystemExit(f"tidings: no token {token_id}")
    return {"token_id": str(token.id), "revoked_at": token.revoked_at.isoformat()}


QUOTA_OPTIONS: tuple[tuple[str, quota_store.Channel, quota_store.Period], ...] = (
    ("emails_per_day", "email", "day"),
    ("emails_per_month", "email", "month"),
    ("sms_per_day", "sms", "day"),
    ("sms_per_month", "sms", "month"),
)


async def manage_quotas(config: Config, args: argparse.Namespace) -> dict[str, object]:
    """``quotas set`` and ``quotas show``: the team's quotas after any change."""
    changes = [
        quota_store.LimitChange(channel, period, getattr(args, option))
        for option, channel, period in QUOTA_OPTIONS
        if getattr(args, option, False) is not False
    ]
    if args.quotas_command == "set" and not changes:
        raise SystemExit("tidings: quotas set needs at least one --emails-per-* or --sms-per-*")
    try:
        team = token_store.check_team_name(args.team)
    except ValueError as error:
        raise SystemExit(f"tidings: --team: {error}") from None
    async with open_database(config) as db, db.transaction() as conn:
        team_id = await quota_store.team_by_name(conn, team)
        if team_id is not None:
            await quota_store.set_limits(conn, team_id, changes)
            statuses = await quota_store.quota_status(conn, team_id, config.quotas)
    # Not inside the database's nursery: there it would come out in an ExceptionGroup.
    if team_id is None:
        raise SystemExit(f"tidings: no team {team!r}")
    shown: dict[str, object] = {"team_id": str(team_id), "team": team}
    for status in statuses:
        name = f"{'emails' if status.channel == 'email' else 'sms'}_per_{status.period}"
        shown[name] = {
            "limit": status.limit,
            "default": status.default,
            "used": status.used,
            "resets_at": status.resets_at.isoformat().replace("+00:00", "Z"),
        }
    return shown


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="tidings", description=DESCRIPTION)
    top.add_argument("--version", action="version", version=f"tidings {__version__}")
    commands = top.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="what to do"
    )

    run = commands.add_parser(
        "serve", help="run the HTTP API and every actor",
        description="Run the HTTP API and every actor until SIGTERM or Ctrl-C.",
    )
    run.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    run.add_argument(
        "--port", type=port_number, default=8080,
        help="port to listen on, 0 to 65535 (default: %(default)s)",
    )
    run.add_argument(
        "--workers", type=whole_number, default=1, metavar="N",
        help="processes serving the port together (SO_REUSEPORT); default 1",
    )
    # A worker of --workers N: bind with SO_REUSEPORT.
    run.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)

    tokens = commands.add_parser("tokens", help="manage team tokens")
    token_commands = tokens.add_subparsers(
        dest="tokens_command", required=True, metavar="COMMAND", help="what to do"
    )
    create = token_commands.add_parser(
        "create", help="create a token (and its team if new); prints one line of JSON",
        description="Create a token (and its team if new); prints one line of JSON.",
    )
    create.add_argument("--team", required=True, help="team name")
    chosen = create.add_mutually_exclusive_group()
    chosen.add_argument("--permissions", help="comma-separated; default: every permission")
    chosen.add_argument("--all", action="store_true", help="every permission")
    create.add_argument(
        "--expires-in", type=decimal_number, metavar="SECONDS",
        help="the token expires this many seconds from now (default: never)",
    )
    create.add_argument(
        "--step-up", action="store_true", help="a step-up token (lives at most 15 minutes)"
    )
    revoke = token_commands.add_parser(
        "revoke", help="revoke a token", description="Revoke a token at once, in every process."
    )
    revoke.add_argument("token_id", type=UUID, help="the token's id (token_id)")

    contacts = commands.add_parser("contacts", help="manage contacts")
    contact_commands = contacts.add_subparsers(
        dest="contacts_command", required=True, metavar="COMMAND", help="what to do"
    )
    load = contact_commands.add_parser(
        "import",
        help="import a CSV file (or a .json array) through the HTTP API; prints one line of JSON",
        description=(
            "Import a CSV file (or a .json array) through POST /contacts/import. "
            "Progress goes to stderr; the added-up report, one line of JSON, to stdout."
        ),
    )
    load.add_argument("file", type=Path, help="CSV with a header row, or a .json array")
    load.add_argument("--team-token", required=True, help="a token with contacts:write")
    load.add_argument("--segment-id", type=UUID, help="add every imported contact to it")
    load.add_argument(
        "--url", default="http://127.0.0.1:8080",
        help="the service's address (default: %(default)s)",
    )
    load.add_argument(
        "--batch-size", type=whole_number, default=importing.MAX_ROWS, metavar="ROWS",
        help=f"rows per request (at most {importing.MAX_ROWS}, the service's limit)",
    )
    load.add_argument("--quiet", action="store_true", help="no progress on stderr")
    quotas = commands.add_parser("quotas", help="a team's limits on emails and SMS")
    quota_commands = quotas.add_subparsers(
        dest="quotas_command", required=True, metavar="COMMAND", help="what to do"
    )
    set_quotas = quota_commands.add_parser(
        "set", help="set some of a team's quotas; prints its quotas as one line of JSON"
    )
    show_quotas = quota_commands.add_parser(
        "show", help="print a team's quotas, their use and resets as one line of JSON"
    )
    for command in (set_quotas, show_quotas):
        command.add_argument("--team", required=True, help="team name")
    for option, _channel, _period in QUOTA_OPTIONS:
        set_quotas.add_argument(
            "--" + option.replace("_", "-"), type=quota_limit, default=False, metavar="N",
            help="a limit per UTC day or month; 0: unlimited; 'default': the setting's",
        )
    return top


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    found = [error]
    cause = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    if cause is not None:
        found += _leaves(cause)
    return found


def storage_failure(error: BaseException) -> str | None:
    """Why the database could not be used, in one line; None for any other error."""
    for leaf in _leaves(error):
        if isinstance(leaf, (OSError, asyncpg.PostgresError, asyncpg.InterfaceError)):
            reason = " ".join(str(leaf).split()) or type(leaf).__name__
            return f"{reason} ({type(leaf).__name__})"
    return None


def listen_failure(error: BaseException) -> str | None:
    """Why the HTTP port could not be listened on, in one line; None for any other error."""
    for leaf in _leaves(error):
        if isinstance(leaf, OSError) and leaf.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
            return leaf.strerror or str(leaf)
    return None


def where_the_database_is(config: Config) -> str:
    if config.database_url is None:
        return f"the embedded PostgreSQL in {config.data_dir} (TIDINGS_DATA_DIR)"
    # The URL as given, less any user and password (urlunsplit would drop an empty "//").
    scheme, separator, rest = config.database_url.partition("://")
    cut = min([rest.index(c) for c in "/?#" if c in rest] or [len(rest)])
    host = rest[:cut].rpartition("@")[2]
    return f"{shown_url(scheme + separator + host + rest[cut:])} (DATABASE_URL)"


def check_listen_address(host: str, port: int) -> None:
    """``--host`` names an address to listen on; before the database is opened,
    so that a bad one is never reported as a database failure."""
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as error:
        strerror = error.strerror if isinstance(error, OSError) else None
        reason = strerror or " ".join(str(error).split()) or type(error).__name__
        raise SystemExit(f"tidings: cannot listen on {host}:{port}: {reason}") from None


def run_command(args: argparse.Namespace, config: Config) -> None:
    if args.command == "contacts":
        if not 1 <= args.batch_size <= importing.MAX_ROWS:
            raise SystemExit(f"tidings: --batch-size must be 1 to {importing.MAX_ROWS}")
        progress = None if args.quiet else importing.Progress(sys.stderr)
        try:
            report = importing.import_file(
                args.file, args.url, args.team_token, args.segment_id, args.batch_size,
                progress=progress,
            )
        except importing.ImportFailed as failure:
            raise SystemExit(f"tidings: {failure}") from None
        print(json.dumps(report), flush=True)
    elif args.command == "serve":
        if not 1 <= args.workers <= MAX_WORKERS:
            raise SystemExit(f"tidings: --workers must be 1 to {MAX_WORKERS}")
        check_listen_address(args.host, args.port)
        worker = PARENT_ENV in os.environ  # of a set: its parent checked and warned
        if args.workers > 1:
            raise SystemExit(run_workers(config, args.host, args.port, args.workers))
        trio.run(
            lambda: run_until_signal(
                config, args.host, args.port, args.reuse_port, check_limit=not worker
            )
        )
    elif args.command == "quotas":
        print(json.dumps(trio.run(manage_quotas, config, args)), flush=True)
    elif args.tokens_command == "create":
        if args.expires_in is not None and not (
            math.isfinite(args.expires_in) and 0 < args.expires_in <= TEN_YEARS
        ):
            raise SystemExit(
                f"tidings: --expires-in must be positive seconds, at most {TEN_YEARS} "
                "(ten years)"
            )
        try:
            args.team = token_store.check_team_name(args.team)
        except ValueError as error:
            raise SystemExit(f"tidings: --team: {error}") from None
        print(json.dumps(trio.run(create_token, config, args)), flush=True)
    else:
        print(json.dumps(trio.run(revoke_token, config, args.token_id)), flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        config = Config.from_env()
    except SettingError as error:
        raise SystemExit(f"tidings: {error}") from None
    configure_logging(
        config.log_level if args.command == "serve" else "WARNING", config.log_format
    )
    try:
        run_command(args, config)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as error:
        # A command's SystemExit that came out of a nursery, in an ExceptionGroup.
        exits = [leaf for leaf in _leaves(error) if isinstance(leaf, SystemExit)]
        if exits:
            raise exits[0] from None
        if any(isinstance(leaf, BrokenPipeError) for leaf in _leaves(error)):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # `| head` left
            raise SystemExit("tidings: the output was closed before it was all written") from None
        busy = listen_failure(error) if args.command == "serve" else None
        if busy is not None:
            raise SystemExit(f"tidings: cannot listen on {args.host}:{args.port}: {busy}") from None
        reason = storage_failure(error)
        if reason is None:
            raise
        raise SystemExit(
            f"tidings: cannot use the database at {where_the_database_is(config)}: {reason}"
        ) from None
