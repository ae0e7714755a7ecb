"""The ``tidings`` command: serve, bootstrap or revoke credentials, import contacts."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from uuid import UUID

import trio

from tidings import importing
from tidings.app import serve
from tidings.config import Config, SettingError
from tidings.permissions import ALL_PERMISSIONS, unknown_permissions
from tidings.storage import tokens as token_store
from tidings.storage.db import open_database

log = logging.getLogger("tidings")

# After SIGTERM/Ctrl-C everything is done by then, finished or cancelled.
SHUTDOWN_DEADLINE_SECONDS = 9.5


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # The embedded server narrates every start at INFO.
    logging.getLogger("pgserver").setLevel(max(logging.WARNING, logging.getLevelName(level)))


async def run_until_signal(config: Config, host: str, port: int) -> None:
    stop = trio.Event()

    async def watch_signals(cancel_scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                if stop.is_set():
                    log.warning("second signal: stopping now")
                    cancel_scope.cancel()
                    return
                log.info("%s received: draining", signal.Signals(signum).name)
                stop.set()
                cancel_scope.deadline = trio.current_time() + SHUTDOWN_DEADLINE_SECONDS

    with trio.CancelScope() as everything:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_signals, everything)
            await serve(config, host, port, shutdown_trigger=stop.wait)
            nursery.cancel_scope.cancel()
    if everything.cancelled_caught:
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


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="tidings", description=__doc__)
    commands = top.add_subparsers(dest="command", required=True)

    run = commands.add_parser("serve", help="run the HTTP API and every actor")
    run.add_argument("--host", default="127.0.0.1")
    run.add_argument("--port", type=int, default=8080)

    tokens = commands.add_parser("tokens", help="manage team tokens")
    token_commands = tokens.add_subparsers(dest="tokens_command", required=True)
    create = token_commands.add_parser(
        "create", help="create a token (and its team if new); prints one line of JSON"
    )
    create.add_argument("--team", required=True, help="team name")
    chosen = create.add_mutually_exclusive_group()
    chosen.add_argument("--permissions", help="comma-separated; default: every permission")
    chosen.add_argument("--all", action="store_true", help="every permission")
    create.add_argument("--expires-in", type=float, metavar="SECONDS")
    create.add_argument(
        "--step-up", action="store_true", help="a step-up token (lives at most 15 minutes)"
    )
    revoke = token_commands.add_parser("revoke", help="revoke a token")
    revoke.add_argument("token_id", type=UUID)

    contacts = commands.add_parser("contacts", help="manage contacts")
    contact_commands = contacts.add_subparsers(dest="contacts_command", required=True)
    load = contact_commands.add_parser(
        "import",
        help="import a CSV file (or a .json array) through the HTTP API; prints one line of JSON",
    )
    load.add_argument("file", type=Path, help="CSV with a header row, or a .json array")
    load.add_argument("--team-token", required=True, help="a token with contacts:write")
    load.add_argument("--segment-id", type=UUID, help="add every imported contact to it")
    load.add_argument("--url", default="http://127.0.0.1:8080", help="the service's address")
    load.add_argument(
        "--batch-size", type=int, default=importing.MAX_ROWS, metavar="ROWS",
        help=f"rows per request (at most {importing.MAX_ROWS}, the service's limit)",
    )
    return top


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        config = Config.from_env()
    except SettingError as error:
        raise SystemExit(f"tidings: {error}") from None
    configure_logging(config.log_level if args.command == "serve" else "WARNING")
    if args.command == "contacts":
        if not 1 <= args.batch_size <= importing.MAX_ROWS:
            raise SystemExit(f"tidings: --batch-size must be 1 to {importing.MAX_ROWS}")
        try:
            report = importing.import_file(
                args.file, args.url, args.team_token, args.segment_id, args.batch_size
            )
        except importing.ImportFailed as failure:
            raise SystemExit(f"tidings: {failure}") from None
        print(json.dumps(report), flush=True)
    elif args.command == "serve":
        trio.run(run_until_signal, config, args.host, args.port)
    elif args.tokens_command == "create":
        if args.expires_in is not None and args.expires_in <= 0:
            raise SystemExit("tidings: --expires-in must be positive")
        try:
            args.team = token_store.check_team_name(args.team)
        except ValueError as error:
            raise SystemExit(f"tidings: --team: {error}") from None
        print(json.dumps(trio.run(create_token, config, args)), flush=True)
    else:
        print(json.dumps(trio.run(revoke_token, config, args.token_id)), flush=True)
