"""CSV imports whose quoting is broken, or whose cells are very long: over
HTTP (``POST /contacts/import``) and from ``tidings contacts import``."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.conftest import Credential, assert_error
from tests.http.audience import define, ok, tidings
from tidings import importing

CSV = {"Content-Type": "text/csv"}

# Line 3 opens a quote that nothing closes: read leniently, the rest of the
# body became q2's first name, and q3 and q4 were never imported.
UNCLOSED = (
    "email,first_name\n"
    "q1@example.com,Ann\n"
    'q2@example.com,"Smith, J\n'
    "q3@example.com,Carol\n"
    "q4@example.com,Dave\n"
)
# csv's default limit on a field is 131,072 characters.
HUGE = 200_000


async def post_csv(client: httpx.AsyncClient, text: str) -> httpx.Response:
    return await client.post("/contacts/import", content=text.encode(), headers=CSV)


async def listed(client: httpx.AsyncClient) -> list[str]:
    return sorted(c["email"] for c in ok(await client.get("/contacts"))["data"])


async def test_an_unclosed_quote_refuses_the_body_naming_its_line(
    client: httpx.AsyncClient,
) -> None:
    message = assert_error(await post_csv(client, UNCLOSED), 400, "BAD_REQUEST")
    assert message.startswith("CSV body: line 3: a quoted field"), message
    assert "never closed" in message and "to line 5" in message
    assert "nothing was imported" in message
    # At the end of the body, and in the header, too.
    last = "email,first_name\nq1@example.com,Ann\nq2@example.com,\"Smith"
    assert "line 3:" in assert_error(await post_csv(client, last), 400, "BAD_REQUEST")
    header = 'email,"first_name\nq1@example.com,Ann\n'
    assert "line 1:" in assert_error(await post_csv(client, header), 400, "BAD_REQUEST")
    assert await listed(client) == []


async def test_text_after_a_closing_quote_refuses_the_body(client: httpx.AsyncClient) -> None:
    bodies = [
        ('email,first_name\nq1@example.com,Ann\nq2@example.com,"x"y\n', "line 3:"),
        ('email,first_name\nq1@example.com,"Ann" \n', "line 2:"),
        # The quoted field spans lines 2 and 3; line 3 has the stray text.
        ('email,first_name\nq1@example.com,"A\nnn"n\nq2@example.com,B\n', "line 3:"),
        ('email,first_name\r\nq1@example.com,"Ann"Lee\r\n', "line 2:"),
    ]
    for text, line in bodies:
        message = assert_error(await post_csv(client, text), 400, "BAD_REQUEST")
        assert message.startswith(f"CSV body: {line} a quoted field goes on after"), message
        assert 'written twice ("")' in message and "nothing was imported" in message
    assert await listed(client) == []

    # Quoting as RFC 4180 has it is read as before; a quote inside a field
    # that does not start with one is taken as it is.
    text = (
        'email,first_name,last_name\r\n'
        'q1@example.com,"Ann ""Nan""","Lee,\r\nJr"\r\n'
        "q2@example.com,O\"Brien,5'11\"\r\n"
        '"q3@example.com","",Zed'
    )
    report = ok(await post_csv(client, text))
    assert (report["rows"], report["created"], report["rejected_count"]) == (3, 3, 0)
    ann = ok(await client.get("/contacts/q1@example.com"))
    assert (ann["first_name"], ann["last_name"]) == ('Ann "Nan"', "Lee,\r\nJr")
    obrien = ok(await client.get("/contacts/q2@example.com"))
    assert (obrien["first_name"], obrien["last_name"]) == ('O"Brien', "5'11\"")
    assert ok(await client.get("/contacts/q3@example.com"))["first_name"] is None


async def test_a_cell_too_long_for_its_field_rejects_its_row_alone(
    client: httpx.AsyncClient,
) -> None:
    await define(client, key="note", type="string")
    quoted_lines = '"' + ("y" * 999 + "\n") * (HUGE // 1000) + '"'
    text = (
        "email,first_name,note\n"
        "a@example.com,Ann,short\n"
        f"b@example.com,{'x' * HUGE},\n"
        f"c@example.com,,{'z' * HUGE}\n"
        f"d@example.com,{quoted_lines},\n"
        "e@example.com,Eve,\n"
    )
    report = ok(await post_csv(client, text))
    assert (report["rows"], report["created"], report["rejected_count"]) == (5, 2, 3)
    reasons = {r["row"]: r["reason"] for r in report["rejected"]}
    assert sorted(reasons) == [2, 3, 4]
    assert reasons[2].startswith("first_name: ") and "255" in reasons[2]
    assert reasons[3].startswith("properties.note: ") and "2000" in reasons[3]
    assert reasons[4].startswith("first_name: ") and "255" in reasons[4]
    assert await listed(client) == ["a@example.com", "e@example.com"]


# --- the command line ------------------------------------------------------------------------


async def test_cli_refuses_a_file_with_broken_quoting_before_sending_it(
    client: httpx.AsyncClient, base_url: str, acme: Credential, tmp_path: Path
) -> None:
    files = {
        "unclosed.csv": (UNCLOSED, "line 3: a quoted field in the row that starts here"),
        "stray.csv": (
            'email,first_name\nq1@example.com,Ann\nq2@example.com,"x"y\nq3@example.com,C\n',
            "line 3: a quoted field goes on after",
        ),
    }
    for name, (text, needle) in files.items():
        path = tmp_path / name
        path.write_text(text)
        # In one request as the file is, and re-split into batches.
        for batch_size in ("50000", "1"):
            done = await tidings("contacts", "import", str(path), "--team-token", acme.secret,
                                 "--url", base_url, "--batch-size", batch_size)
            stderr = done.stderr.decode()
            assert done.returncode == 1, (name, batch_size, stderr)
            assert "the file is not valid CSV: " + needle in stderr, stderr
            assert "nothing was imported" in stderr and done.stdout == b""
    assert await listed(client) == []


def test_cli_reads_the_file_before_reaching_the_service(tmp_path: Path) -> None:
    path = tmp_path / "contacts.csv"
    path.write_text(UNCLOSED)
    # Nothing listens on port 9: the file is refused before any request.
    with pytest.raises(importing.ImportFailed, match="not valid CSV: line 3: "):
        importing.import_file(path, "http://127.0.0.1:9", "svc_team_x", None, batch_size=2)


async def test_cli_sends_a_long_cell_for_its_row_to_be_rejected(
    client: httpx.AsyncClient, base_url: str, acme: Credential, tmp_path: Path
) -> None:
    path = tmp_path / "contacts.csv"
    path.write_text(
        "email,first_name\n"
        "a@example.com,Ann\n"
        f"b@example.com,{'x' * HUGE}\n"
        "c@example.com,Cy\n"
    )
    done = await tidings("contacts", "import", str(path), "--team-token", acme.secret,
                         "--url", base_url, "--batch-size", "2")
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(done.stdout)
    assert (report["requests"], report["rows"], report["created"]) == (2, 3, 2)
    assert [r["row"] for r in report["rejected"]] == [2]
    assert report["rejected"][0]["reason"].startswith("first_name: ")
    assert await listed(client) == ["a@example.com", "c@example.com"]
