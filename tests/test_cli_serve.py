"""``tidings serve`` as a real process: shutdown lets a slow request finish,
then stops the embedded PostgreSQL; logs are JSON lines with the access log;
``tidings contacts import`` shows its progress."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import trio

from tests.conftest import Credential
from tests.test_e2e import free_port, service_env, wait_healthy

ROWS = 50_000


def contacts_csv(rows: int) -> bytes:
    lines = ["email,first_name"] + [f"user{n}@example.com,User {n}" for n in range(rows)]
    return ("\n".join(lines) + "\n").encode()


async def test_sigterm_lets_an_import_in_flight_finish_then_stops_postgres(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    env = {**service_env(data_dir), "TIDINGS_LOG_FORMAT": "json", "TIDINGS_LOG_LEVEL": "INFO"}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log_file:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "tidings", "serve", "--port", str(port)],
            env=env, stderr=log_file, stdout=log_file,
        )
        try:
            await wait_healthy(url, process)
            created = await trio.run_process(
                [sys.executable, "-m", "tidings", "tokens", "create", "--team", "acme"],
                env=env, capture_stdout=True,
            )
            token = json.loads(created.stdout)["token"]
            body = contacts_csv(ROWS)
            answer: list[httpx.Response] = []

            async def import_all() -> None:
                async with httpx.AsyncClient(base_url=url, timeout=120) as client:
                    answer.append(await client.post(
                        "/contacts/import", content=body,
                        headers={"Authorization": f"Bearer {token}",
                                 "Content-Type": "text/csv", "X-Request-Id": "big-import"},
                    ))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(import_all)
                await trio.sleep(1.0)  # the body is sent; the service is importing
                assert not answer, "the import finished before SIGTERM: use more rows"
                process.send_signal(signal.SIGTERM)
            with trio.fail_after(60):
                code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()

    assert code == 0
    [response] = answer
    assert response.status_code == 200, response.text
    assert response.json()["data"]["created"] == ROWS
    assert response.headers["X-Request-Id"] == "big-import"
    # Logs: one JSON object per line, the access log among them.
    records = [json.loads(line) for line in log_path.read_text().splitlines() if line]
    [access] = [r for r in records if r.get("request_id") == "big-import"
                and r["logger"] == "tidings.access"]
    assert access["route"] == "/contacts/import" and access["status"] == 200
    assert access["method"] == "POST" and access["team_id"]
    assert access["duration_ms"] > 0
    # The embedded PostgreSQL was stopped with the last process using it.
    assert not list(data_dir.rglob("postmaster.pid"))


async def test_contacts_import_shows_progress_unless_quiet(
    base_url: str, acme: Credential, tmp_path: Path
) -> None:
    credential = acme
    path = tmp_path / "contacts.csv"
    path.write_bytes(contacts_csv(250))
    command = [
        sys.executable, "-m", "tidings", "contacts", "import", str(path),
        "--team-token", credential.secret, "--url", base_url, "--batch-size", "100",
    ]
    loud = await trio.run_process(command, capture_stdout=True, capture_stderr=True)
    progress = loud.stderr.decode().splitlines()
    assert any("sent rows 201 to 250 of 250" in line for line in progress), progress
    assert any("250 of 250 rows imported" in line and "rows/s" in line for line in progress)
    assert json.loads(loud.stdout)["rows"] == 250
    quiet = await trio.run_process([*command, "--quiet"], capture_stdout=True,
                                   capture_stderr=True)
    assert quiet.stderr == b""
    assert json.loads(quiet.stdout)["updated"] == 250


async def authorization_line(env: dict[str, str]) -> bytes:
    """The ``Authorization`` header line of a new token of every permission."""
    created = await trio.run_process(
        [sys.executable, "-m", "tidings", "tokens", "create", "--team", "acme", "--all"],
        env=env, capture_stdout=True,
    )
    return b"Authorization: Bearer " + json.loads(created.stdout)["token"].encode()


async def test_answers_during_shutdown_close_their_connections(tmp_path: Path) -> None:
    """A request in flight at SIGTERM is answered with ``Connection: close``, so a
    pooled client does not send its next request on a connection about to end;
    one sent there anyway is not waited for: the process exits at once, not
    after the whole grace (30 s)."""
    env = service_env(tmp_path / "data")
    port = free_port()
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "tidings", "serve", "--port", str(port)], env=env)
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", process)
        auth = await authorization_line(env)
        body = b'{"email": "ada@example.com"}'
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"POST /contacts HTTP/1.1\r\nHost: a\r\n" + auth + (
            b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)))
        await stream.send_all(body[:5])
        await trio.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        await trio.sleep(0.3)
        await stream.send_all(body[5:])
        received = b""
        with trio.fail_after(10):
            while b"}}" not in received:
                received += await stream.receive_some(65536)
        head = received.partition(b"\r\n\r\n")[0].lower()
        assert head.startswith(b"http/1.1 201")
        assert b"\r\nconnection: close" in head
        answered = trio.current_time()
        try:
            await stream.send_all(b"GET /contacts HTTP/1.1\r\nHost: a\r\n" + auth + b"\r\n\r\n")
            with trio.fail_after(10):
                assert await stream.receive_some(65536) == b""  # closed, not answered
        except trio.BrokenResourceError:
            pass  # closed already
        await stream.aclose()
        with trio.fail_after(20):
            assert await process.wait() == 0
        assert trio.current_time() - answered < 10
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_a_second_signal_stops_at_once_and_says_so(tmp_path: Path) -> None:
    """A second SIGTERM during the drain stops the process at once; the log
    says that, not that the grace's deadline was reached (it was not)."""
    env = service_env(tmp_path / "data")
    port = free_port()
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "tidings", "serve", "--port", str(port)], env=env,
        stderr=subprocess.PIPE)
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", process)
        auth = await authorization_line(env)
        # A request whose body never ends: the drain waits for it (up to 30 s).
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"POST /contacts HTTP/1.1\r\nHost: a\r\n" + auth
                              + b"\r\nContent-Type: application/json\r\n"
                              b"Content-Length: 100\r\n\r\n{")
        await trio.sleep(0.3)
        process.send_signal(signal.SIGTERM)
        await trio.sleep(1.5)  # more than a second apart: not the same stop
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(10):  # well within the grace (30 s)
            assert await process.wait() == 0
        assert process.stderr is not None
        log = b""
        while chunk := await process.stderr.receive_some(65536):
            log += chunk
        assert b"second signal: stopping now" in log
        assert b"deadline reached" not in log
        await stream.aclose()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
