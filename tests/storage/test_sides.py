"""Which storage work may run on the asyncio side (``Database.run``), and the
three guards that keep trio out of it (see tidings/storage/db.py)."""

from __future__ import annotations

import ast
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tidings.config import Config
from tidings.storage import tokens
from tidings.storage.db import (
    AsyncioConnection,
    Connection,
    Database,
    TrioConnection,
    WrongSide,
    open_database,
)

PACKAGE = Path(__file__).resolve().parents[2] / "tidings"
TRIO_MODULES = {"trio", "trio_asyncio", "triopg", "anyio"}
EITHER_SIDE = {"Connection", "AsyncioConnection"}


def modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        yield name, ast.parse(path.read_text(), str(path))


def trio_names(tree: ast.Module) -> set[str]:
    """Names a module binds to trio and its kin, by any import."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in TRIO_MODULES:
                    names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in TRIO_MODULES:
                names.update(alias.asname or alias.name for alias in node.names)
    return names


def connection_param(function: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The first parameter's name when it is typed Connection or AsyncioConnection."""
    params = function.args.posonlyargs + function.args.args
    if not params or params[0].annotation is None:
        return None
    annotation = ast.unparse(params[0].annotation).strip("'\"").rpartition(".")[2]
    return params[0].arg if annotation in EITHER_SIDE else None


def local_names(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    arguments = function.args
    names = {a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs}
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def awaits_only_its_connection(
    function: ast.FunctionDef | ast.AsyncFunctionDef, conn: str
) -> list[str]:
    """What ``function`` awaits other than a method of a local (its connection, a
    prepared statement) or a function it hands its connection to."""
    local = local_names(function)
    wrong = []
    for node in ast.walk(function):
        awaited: ast.expr | None = None
        if isinstance(node, ast.Await):
            awaited = node.value
        elif isinstance(node, (ast.AsyncWith, ast.AsyncFor)):
            items = node.items if isinstance(node, ast.AsyncWith) else []
            for item in items:
                call = item.context_expr
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and isinstance(call.func.value, ast.Name) and call.func.value.id == conn):
                    wrong.append(ast.unparse(call))
            continue
        if awaited is None:
            continue
        if isinstance(awaited, ast.Call):
            callee = awaited.func
            if isinstance(callee, ast.Attribute) and isinstance(callee.value, ast.Name) and (
                callee.value.id in local
            ):
                continue  # conn.fetch(...), statement.fetchrow(...)
            first = awaited.args[0] if awaited.args else None
            if isinstance(first, ast.Name) and first.id == conn:
                continue  # another storage function, given the connection
        wrong.append(ast.unparse(awaited))
    return wrong


def test_storage_modules_do_not_import_trio() -> None:
    for name, tree in modules():
        if name.startswith("tidings.storage.") and name != "tidings.storage.db":
            assert not trio_names(tree), f"{name} imports {trio_names(tree)}"


def test_work_that_may_run_on_asyncio_awaits_only_its_connection() -> None:
    checked = 0
    for name, tree in modules():
        forbidden = trio_names(tree)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            conn = connection_param(node)
            if conn is None:
                continue
            checked += 1
            where = f"{name}.{node.name}"
            used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} & forbidden
            assert not used, f"{where} is typed for either side but uses {used}"
            assert not awaits_only_its_connection(node, conn), (
                f"{where} awaits {awaits_only_its_connection(node, conn)}"
            )
    assert checked > 50  # every storage function, and the units outside storage


def test_the_check_catches_trio_in_a_unit() -> None:
    source = textwrap.dedent(
        """
        import trio
        from tidings import elsewhere
        async def unit(conn: AsyncioConnection) -> None:
            await conn.execute("SELECT 1")
            await trio.sleep(0)
            await elsewhere.helper()
        """
    )
    tree = ast.parse(source)
    function = tree.body[2]
    assert isinstance(function, ast.AsyncFunctionDef)
    assert connection_param(function) == "conn"
    assert trio_names(tree) == {"trio"}
    assert awaits_only_its_connection(function, "conn") == ["trio.sleep(0)", "elsewhere.helper()"]


# --- at run time ---------------------------------------------------------------


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    async with open_database(Config(database_url=database_url, db_pool_size=2)) as database:
        yield database


async def count_tokens(conn: AsyncioConnection, prefix: str) -> int:
    found: int = await conn.fetchval("SELECT count(*) FROM api_tokens WHERE prefix LIKE $1",
                                     prefix + "%")
    return found


async def reach_back(conn: AsyncioConnection, db: Database) -> None:
    async with db.acquire():
        pass


async def trio_side(conn: TrioConnection) -> None:
    await conn.execute("SELECT 1")


async def untyped(conn, prefix):  # type: ignore[no-untyped-def]
    return await conn.fetchval("SELECT 1")


async def test_storage_functions_and_asyncio_units_run_in_one_crossing(db: Database) -> None:
    assert await db.run(tokens.find_by_hash, b"\x00" * 32) is None
    assert await db.run(count_tokens, prefix="svc_") == 0


async def test_other_work_is_refused_before_it_crosses(db: Database) -> None:
    async def closure(conn: Connection) -> None:
        await conn.execute("SELECT 1")

    for unit in (trio_side, untyped, closure, lambda conn: conn.fetchval("SELECT 1")):
        with pytest.raises(WrongSide, match="may not run on the asyncio side"):
            await db.run(unit)  # type: ignore[arg-type]


async def test_a_unit_cannot_reach_back_for_the_pool(db: Database) -> None:
    with pytest.raises(WrongSide, match="Database.acquire from inside Database.run"):
        await db.run(reach_back, db)
    # The mark stays on the asyncio side: trio code goes on as before.
    async with db.acquire() as conn:
        assert await conn.fetchval("SELECT 1") == 1


def test_mypy_refuses_a_unit_written_for_trio(tmp_path: Path) -> None:
    api = pytest.importorskip("mypy.api")
    snippet = tmp_path / "snippet.py"
    snippet.write_text(textwrap.dedent(
        """
        from tidings.storage.db import AsyncioConnection, Connection, Database, TrioConnection

        async def trio_side(conn: TrioConnection, n: int) -> int:
            return n

        async def either(conn: Connection, n: int) -> int:
            return n

        async def main(db: Database) -> None:
            await db.run(either, 1)
            await db.run(trio_side, 1)  # line 12
            await db.run(either, "one")  # line 13
            async with db.acquire() as conn:
                await either(conn, 2)
                stolen: AsyncioConnection = conn  # line 16
        """
    ))
    out, _, status = api.run([
        "--strict", "--no-incremental", "--cache-dir", str(tmp_path / "cache"),
        "--config-file", str(PACKAGE.parent / "pyproject.toml"), str(snippet),
    ])
    errors = sorted(
        int(line.split(":")[1]) for line in out.splitlines() if ": error:" in line
    )
    assert status == 1 and errors == [12, 13, 16], out
