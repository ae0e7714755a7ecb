"""`tidings serve --workers 2`: two processes answer on one port and stop together."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import httpx
import trio

from tests.db_proxy import DatabaseProxy
from tests.test_e2e import free_port, service_env, wait_healthy
from tidings.workers import (
    METRICS_DIR_PREFIX,
    RESTARTS,
    port_lock,
    remove_orphan_metric_dirs,
)


def workers_command(port: int) -> list[str]:
    return [sys.executable, "-m", "tidings", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--workers", "2"]


async def start_set(data_dir: Path) -> tuple[int, dict[str, str], trio.Process]:
    """A healthy ``--workers 2`` set on a free port: its port, environment and process."""
    port = free_port()
    env = service_env(data_dir)
    process = await trio.lowlevel.open_process(
        workers_command(port), env=env, stderr=subprocess.DEVNULL)
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", process)
    except BaseException:
        process.kill()
        await process.wait()
        raise
    return port, env, process


async def worker_pids(url: str, count: int = 2) -> set[int]:
    """The pids of the workers answering at ``url`` (``count`` of them), seen live
    (dead ones may linger in no answer)."""
    pids: set[int] = set()
    with trio.fail_after(30):
        while len(pids := {pid for pid in pids if alive(pid)}) < count:
            # A new connection each time: the kernel picks a worker per connection.
            async with httpx.AsyncClient() as client:
                try:
                    metrics = (await client.get(f"{url}/metrics")).text
                except httpx.TransportError:  # a worker killed under this connection
                    continue
            found = re.findall(r'tidings_process\{pid="(\d+)"', metrics)
            pids.update(int(pid) for pid in found)
    return pids


def lock_path(host: str, port: int) -> Path:
    return Path(tempfile.gettempdir()) / f"tidings-workers-{host}-{port}.lock"


def test_the_port_lock_is_exclusive_and_removed_by_its_holder() -> None:
    port = free_port()
    path = lock_path("127.0.0.1", port)
    with port_lock("127.0.0.1", port):
        assert path.exists()
        try:
            with port_lock("127.0.0.1", port):
                raise AssertionError("a second holder got the lock")
        except OSError as error:
            assert error.errno == errno.EADDRINUSE
        assert path.exists()  # refused, the second one removed nothing
    assert not path.exists()
    with port_lock("127.0.0.1", port):  # and it can be taken again
        assert path.exists()
    assert not path.exists()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_two_workers_share_the_port_and_stop_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = workers_command(port)
    process = await trio.lowlevel.open_process(
        command, env=service_env(tmp_path / "data"), stderr=subprocess.DEVNULL
    )
    try:
        await wait_healthy(url, process)
        pids = await worker_pids(url)
        assert process.pid not in pids
        assert all(alive(pid) for pid in pids)
        lock = lock_path("127.0.0.1", port)
        assert lock.exists()

        process.send_signal(signal.SIGTERM)
        with trio.fail_after(15):
            assert await process.wait() == 0
        assert not any(alive(pid) for pid in pids)
        assert not lock.exists()  # a set leaves no file behind
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def assert_replays_on_every_worker(url: str, env: dict[str, str]) -> None:
    """A response that shows a secret is stored sealed; a retry of the request
    replays it whichever worker takes it."""
    created = await trio.run_process(
        [sys.executable, "-m", "tidings", "tokens", "create", "--team", "acme", "--all",
         "--step-up"],
        env=env, capture_stdout=True,
    )
    token = json.loads(created.stdout)["token"]
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": "new-token"}
    body = {"permissions": ["contacts:read"]}
    answers = []
    for _ in range(16):
        # A new connection each time: the kernel picks a worker per connection.
        async with httpx.AsyncClient(base_url=url, headers=headers) as client:
            answers.append(await client.post("/tokens", json=body))
    first, replays = answers[0], answers[1:]
    assert first.status_code == 201, first.text
    assert [r.status_code for r in replays] == [201] * len(replays), [
        r.text for r in replays if r.status_code != 201]
    assert all(r.headers["Idempotent-Replayed"] == "true" for r in replays)
    assert {r.content for r in replays} == {first.content}


async def test_workers_on_the_embedded_database_replay_sealed_responses(tmp_path: Path) -> None:
    port, env, process = await start_set(tmp_path / "data")
    try:
        await assert_replays_on_every_worker(f"http://127.0.0.1:{port}", env)
    finally:
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(15):
            await process.wait()


async def test_workers_on_a_database_url_without_a_secret_key_replay_sealed_responses(
    tmp_path: Path, database_url: str,
) -> None:
    """With DATABASE_URL and no TIDINGS_SECRET_KEY the parent hands its workers
    one sealing key, and warns once that other hosts would need the same."""
    port = free_port()
    env = {**service_env(tmp_path / "data"), "DATABASE_URL": database_url}
    env.pop("TIDINGS_SECRET_KEY", None)
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log_file:
        process = await trio.lowlevel.open_process(
            workers_command(port), env=env, stderr=log_file)
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", process)
        assert len(await worker_pids(f"http://127.0.0.1:{port}")) == 2
        await assert_replays_on_every_worker(f"http://127.0.0.1:{port}", env)
    finally:
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(15):
            await process.wait()
    assert log_path.read_text().count("TIDINGS_SECRET_KEY is not set") == 1


async def test_workers_refuse_a_taken_port_and_finish_slow_requests_on_sigterm(
    tmp_path: Path,
) -> None:
    """A second set of workers does not join the first one's port (SO_REUSEPORT
    would split its traffic between two services); on SIGTERM a request in
    flight longer than 10 s still finishes within the grace, and the set exits 0."""
    port, env, process = await start_set(tmp_path / "data")
    url = f"http://127.0.0.1:{port}"
    command = workers_command(port)
    try:
        with trio.fail_after(60):
            second = await trio.run_process(
                command, env=service_env(tmp_path / "other"), capture_stderr=True, check=False)
        assert second.returncode == 1
        assert f"cannot listen on 127.0.0.1:{port}" in second.stderr.decode()

        token = await _token(env)
        answer = await _trickle(port, token, during=12, signal_after=1,
                                signal=lambda: process.send_signal(signal.SIGTERM))
        assert answer.startswith(b"HTTP/1.1 201"), answer
        with trio.fail_after(15):
            assert await process.wait() == 0
        # Its connections in TIME-WAIT do not keep it from starting again at once.
        process = await trio.lowlevel.open_process(command, env=env, stderr=subprocess.DEVNULL)
        await wait_healthy(url, process)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(30):
                await process.wait()


async def test_two_sets_started_at_once_do_not_share_a_port(tmp_path: Path) -> None:
    port = free_port()
    command = workers_command(port)
    sets = [
        await trio.lowlevel.open_process(
            command, env=service_env(tmp_path / f"data{n}"), stderr=subprocess.DEVNULL)
        for n in range(2)
    ]
    try:
        with trio.fail_after(60):
            while all(each.returncode is None for each in sets):
                await trio.sleep(0.1)
        [refused] = [each for each in sets if each.returncode is not None]
        assert refused.returncode == 1
        [running] = [each for each in sets if each is not refused]
        await wait_healthy(f"http://127.0.0.1:{port}", running)
    finally:
        for each in sets:
            if each.returncode is None:
                each.send_signal(signal.SIGTERM)
                with trio.fail_after(30):
                    await each.wait()


async def test_workers_need_a_fixed_port(tmp_path: Path) -> None:
    done = await trio.run_process(
        [sys.executable, "-m", "tidings", "serve", "--port", "0", "--workers", "2"],
        env=service_env(tmp_path / "data"), capture_stderr=True, check=False)
    assert done.returncode == 1
    assert "--workers needs a fixed --port" in done.stderr.decode()


def children(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []


async def test_workers_stopped_while_starting_exit_0(tmp_path: Path) -> None:
    """SIGTERM while the embedded database starts, or just after the workers
    were started, stops everything cleanly: exit status 0."""
    command = workers_command(free_port())
    moments = {
        "while the database starts": lambda pid, data: any(data.rglob("postmaster.pid")),
        "as the workers start": lambda pid, data: len(children(pid)) >= 2,
    }
    for number, (moment, reached) in enumerate(moments.items()):
        data = tmp_path / f"data{number}"
        process = await trio.lowlevel.open_process(
            command, env=service_env(data), stderr=subprocess.DEVNULL)
        with trio.fail_after(60):
            while not reached(process.pid, data):
                await trio.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            assert await process.wait() == 0, f"SIGTERM {moment}"


async def test_a_worker_that_dies_is_replaced_and_the_set_serves_on(tmp_path: Path) -> None:
    port, _, process = await start_set(tmp_path / "data")
    url = f"http://127.0.0.1:{port}"
    try:
        first = await worker_pids(url)
        killed = min(first)
        os.kill(killed, signal.SIGKILL)
        with trio.fail_after(30):
            while (now := await worker_pids(url)) == first or killed in now:
                await trio.sleep(0.2)
        assert len(now) == 2 and max(first) in now  # one new, the other untouched
        assert process.returncode is None
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{url}/readyz")).status_code == 200
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(15):
            assert await process.wait() == 0
        assert not any(alive(pid) for pid in now)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def workers_of(parent: int) -> set[int]:
    """The live worker processes of a ``--workers`` parent, from /proc."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == parent and state != "Z" and b"--reuse-port" in command:
            found.add(int(entry.name))
    return found


async def test_workers_that_keep_dying_stop_the_set_with_exit_1(tmp_path: Path) -> None:
    _, _, process = await start_set(tmp_path / "data")
    killed: set[int] = set()
    try:
        with trio.fail_after(60):
            while process.returncode is None:
                for pid in workers_of(process.pid) - killed:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                await trio.sleep(0.05)
        assert process.returncode == 1
        # Each exit was replaced, RESTARTS times; the exit after that stopped the set.
        assert len(killed) >= 1 + RESTARTS
        assert not any(alive(pid) for pid in killed)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_every_scrape_counts_the_requests_of_every_worker(tmp_path: Path) -> None:
    """Whichever worker answers ``GET /metrics``, the HTTP counters hold the
    requests of both (files they share), and each scrape names the one that
    answered."""
    port, _, process = await start_set(tmp_path / "data")
    url = f"http://127.0.0.1:{port}"
    try:
        both = await worker_pids(url)
        for _ in range(20):
            async with httpx.AsyncClient() as client:  # a worker picked per connection
                assert (await client.get(f"{url}/no-such-route")).status_code == 404
        answered: set[int] = set()
        with trio.fail_after(30):
            while answered != both:
                async with httpx.AsyncClient() as client:
                    text = (await client.get(f"{url}/metrics")).text
                [pid] = re.findall(r'^tidings_process\{pid="(\d+)"\} 1\.0$', text, re.M)
                answered.add(int(pid))
                counted = re.findall(
                    r'^tidings_http_requests_total\{[^}]*status="404"[^}]*\} (\S+)$', text, re.M
                )
                assert sum(float(value) for value in counted) == 20, (pid, counted)
    finally:
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(15):
            await process.wait()


def test_metric_directories_of_sets_whose_parent_is_gone_are_removed() -> None:
    """A parent killed with SIGKILL leaves its set's metric directory behind:
    the next set removes it, and leaves those of live sets alone."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    base = Path(tempfile.gettempdir())
    orphan = Path(tempfile.mkdtemp(prefix=f"{METRICS_DIR_PREFIX}{dead.pid}-", dir=base))
    (orphan / "counter_1.db").write_bytes(b"\0" * 16)
    live = Path(tempfile.mkdtemp(prefix=f"{METRICS_DIR_PREFIX}{os.getpid()}-", dir=base))
    try:
        remove_orphan_metric_dirs()
        assert not orphan.exists()
        assert live.is_dir()
    finally:
        shutil.rmtree(orphan, ignore_errors=True)
        shutil.rmtree(live, ignore_errors=True)


async def _trickle(port: int, token: str, during: float, signal_after: float,
                   signal: Callable[[], None]) -> bytes:
    """A POST /contacts whose body trickles in over ``during`` seconds,
    ``signal`` called ``signal_after`` seconds in; the answer (b"" if none)."""
    body = b'{"email": "slow@example.com"}'
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(
            b"POST /contacts HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + token.encode() + b"\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        pause = during / len(body)
        try:
            for index, byte in enumerate(body):
                if index == round(signal_after / pause):
                    signal()
                await stream.send_all(bytes([byte]))
                await trio.sleep(pause)
            with trio.fail_after(10):
                return await stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""


async def _token(env: dict[str, str]) -> str:
    created = await trio.run_process(
        [sys.executable, "-m", "tidings", "tokens", "create", "--team", "acme", "--all"],
        env=env, capture_stdout=True,
    )
    token: str = json.loads(created.stdout)["token"]
    return token


async def test_a_stop_of_the_whole_group_still_lets_requests_finish(tmp_path: Path) -> None:
    """systemd's default stop signals the parent and every worker at once,
    and the parent forwards its own: one stop, not a second signal that
    would cut the request in flight short."""
    port, env, process = await start_set(tmp_path / "data")
    try:
        pids = await worker_pids(f"http://127.0.0.1:{port}")
        token = await _token(env)

        def stop_group() -> None:
            for pid in (process.pid, *pids):
                os.kill(pid, signal.SIGTERM)

        answer = await _trickle(port, token, during=4, signal_after=1, signal=stop_group)
        assert answer.startswith(b"HTTP/1.1 201"), answer
        with trio.fail_after(15):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_a_second_signal_to_the_parent_stops_the_workers_at_once(tmp_path: Path) -> None:
    """As a single process does: the first drains (grace 30 s), the second
    ends what is left now."""
    port, env, process = await start_set(tmp_path / "data")
    try:
        token = await _token(env)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(
                _trickle, port, token, during=60, signal_after=0.5,
                signal=lambda: process.send_signal(signal.SIGTERM),
            ))
            await trio.sleep(2)
            started = trio.current_time()
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(10):
                await process.wait()
            assert trio.current_time() - started < 8  # well within the 30 s grace
            nursery.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_a_worker_that_dies_while_the_database_is_down_is_replaced_once_it_answers(
    tmp_path: Path, database_url: str
) -> None:
    proxy = DatabaseProxy(database_url)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {**service_env(tmp_path / "data"), "DATABASE_URL": proxy.url}
        process = await trio.lowlevel.open_process(
            workers_command(port), env=env, stderr=subprocess.DEVNULL)
        try:
            await wait_healthy(url, process)
            with trio.fail_after(30):
                while len(first := workers_of(process.pid)) < 2:
                    await trio.sleep(0.05)
            proxy.cut()  # the database goes down
            os.kill(min(first), signal.SIGKILL)
            seen: set[int] = set()
            with trio.move_on_after(3):
                while True:
                    seen |= workers_of(process.pid)
                    await trio.sleep(0.05)
            # No replacement started (it could not have): the set waits.
            assert seen - {min(first)} == {max(first)}
            assert process.returncode is None
            await nursery.start(proxy.serve)  # the database is back
            async def ready(client: httpx.AsyncClient) -> bool:
                try:
                    return (await client.get(f"{url}/readyz")).status_code == 200
                except httpx.TransportError:
                    # Seen once on a loaded CI machine as the replacement
                    # started; whether the survivor served on is asserted below.
                    return False

            async with httpx.AsyncClient() as client:
                with trio.fail_after(60):
                    while len(workers_of(process.pid)) < 2 or not await ready(client):
                        await trio.sleep(0.2)
            assert process.returncode is None and max(first) in workers_of(process.pid)
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(20):
                assert await process.wait() == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
            nursery.cancel_scope.cancel()
