"""POST /contacts/import (JSON and CSV) and ``tidings contacts import``."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.conftest import Credential, assert_error
from tests.http.audience import create, define, make, ok, tidings
from tests.webhooks.receiver import Answer, HangUp, Received, Receiver
from tidings import cli, importing
from tidings.config import Config
from tidings.service import Service

CSV = {"Content-Type": "text/csv"}


async def import_json(client: httpx.AsyncClient, body: Any, **params: Any) -> dict[str, Any]:
    data: dict[str, Any] = ok(await client.post("/contacts/import", json=body, params=params))
    return data


async def import_csv(client: httpx.AsyncClient, text: str, **params: Any) -> dict[str, Any]:
    response = await client.post("/contacts/import", content=text.encode(), headers=CSV,
                                 params=params)
    data: dict[str, Any] = ok(response)
    return data


def rejections(report: dict[str, Any]) -> dict[int, str]:
    assert report["rejected_count"] == len(report["rejected"])
    return {r["row"]: r["reason"] for r in report["rejected"]}


async def test_a_json_import_with_a_number_json_cannot_hold_is_400(
    client: httpx.AsyncClient
) -> None:
    await define(client, key="seats", type="number")
    for number in ("NaN", "Infinity", "1e400"):
        raw = '[{"email": "n@example.com", "properties": {"seats": ' + number + "}}]"
        response = await client.post("/contacts/import", content=raw,
                                     headers={"Content-Type": "application/json"})
        assert "not valid JSON" in assert_error(response, 400, "BAD_REQUEST"), number
    assert ok(await client.get("/contacts"))["data"] == []


async def test_a_csv_number_of_thousands_of_digits_rejects_its_row_alone(
    client: httpx.AsyncClient
) -> None:
    """Python refuses to read a whole number of over 4,300 digits: such a cell
    is a number beyond a double, refused with its row, not a failed import."""
    await define(client, key="seats", type="number")
    report = await import_csv(
        client, "email,seats\nbig@example.com," + "1" * 5000
        + "\nzeros@example.com," + "0" * 5000 + "7\nok@example.com,3\n"
    )
    assert rejections(report) == {1: "properties.seats: must be a finite number (at most 1.8e308)"}
    listed = {c["email"]: c["properties"] for c in ok(await client.get("/contacts"))["data"]}
    assert listed == {"zeros@example.com": {"seats": 7}, "ok@example.com": {"seats": 3}}


async def test_json_import_creates_then_updates(client: httpx.AsyncClient) -> None:
    await define(client, key="plan", type="string")
    await define(client, key="seats", type="number")
    first = await import_json(client, [
        {"email": "Ada@Example.com", "first_name": "Ada", "phone": "+44 20 7946 0958",
         "properties": {"plan": "pro"}, "sms_consent_status": "opted_in"},
        {"email": "grace@example.com", "unsubscribed": True},
    ])
    assert first["object"] == "contact_import"
    assert (first["rows"], first["created"], first["updated"], first["rejected"]) == (2, 2, 0, [])
    assert first["segment_id"] is None and first["added_to_segment"] == 0

    ada = ok(await client.get("/contacts/ada@example.com"))
    assert (ada["email"], ada["first_name"], ada["normalized_phone"], ada["phone_country"]) == (
        "Ada@example.com", "Ada", "+442079460958", "GB"
    )
    assert ada["properties"] == {"plan": "pro"}
    assert (ada["sms_consent_status"], ada["sms_consent_source"]) == ("opted_in", "import")
    assert ada["sms_consent_updated_at"] is not None
    grace = ok(await client.get("/contacts/grace@example.com"))
    assert grace["unsubscribed"] is True and grace["sms_consent_updated_at"] is None

    second = await import_json(client, {"contacts": [
        # Absent values stay; properties merge; "unknown" consent changes nothing.
        {"email": "ADA@example.com", "last_name": "Lovelace", "properties": {"seats": 3},
         "sms_consent_status": "unknown"},
        {"email": "grace@example.com", "unsubscribed": False, "sms_consent_status": "opted_out",
         "sms_consent_source": "paper form"},
        {"email": "alan@example.com"},
    ]})
    assert (second["created"], second["updated"], second["rejected_count"]) == (1, 2, 0)
    ada_again = ok(await client.get(f"/contacts/{ada['id']}"))
    assert (ada_again["first_name"], ada_again["last_name"]) == ("Ada", "Lovelace")
    assert ada_again["phone"] == ada["phone"]
    assert ada_again["properties"] == {"plan": "pro", "seats": 3}
    assert ada_again["sms_consent_status"] == "opted_in"
    assert ada_again["sms_consent_updated_at"] == ada["sms_consent_updated_at"]
    assert ada_again["updated_at"] > ada["updated_at"]
    grace_again = ok(await client.get(f"/contacts/{grace['id']}"))
    assert grace_again["unsubscribed"] is False
    assert (grace_again["sms_consent_status"], grace_again["sms_consent_source"]) == (
        "opted_out", "paper form"
    )
    assert len(ok(await client.get("/contacts"))["data"]) == 3


async def test_rejected_rows_are_reported_and_the_rest_go_in(client: httpx.AsyncClient) -> None:
    await define(client, key="seats", type="number")
    await create(client, email="existing@example.com", first_name="Old")
    report = await import_json(client, [
        {"email": "ok1@example.com"},
        {"email": "not-an-email"},
        {"first_name": "No email"},
        {"email": "ok2@example.com", "nickname": "x"},
        {"email": "ok3@example.com", "phone": "12345"},
        {"email": "ok4@example.com", "properties": {"color": "red"}},
        {"email": "ok5@example.com", "properties": {"seats": "three"}},
        {"email": "OK1@example.com"},
        "ok6@example.com",
        {"email": "ok7@example.com", "unsubscribed": "yes"},
        {"email": "ok8@example.com", "first_name": "a\u0000b"},
        {"email": "existing@example.com", "first_name": "New"},
        {"email": "ok9@example.com", "sms_consent_status": "maybe"},
    ])
    assert (report["rows"], report["created"], report["updated"]) == (13, 1, 1)
    reasons = rejections(report)
    assert sorted(reasons) == [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13]
    expected = {
        2: "email: value is not a valid email address",
        3: "email: is required",
        4: "nickname: is not a known field",
        5: "phone:",
        6: "properties.color: no contact property",
        7: "properties.seats: must be a number",
        8: "email: repeats row 1",
        9: "row: must be a JSON object",
        10: "unsubscribed:",
        11: "NUL",
        13: "sms_consent_status:",
    }
    for row, start in expected.items():
        assert start in reasons[row], (row, reasons[row])
    by_row = {r["row"]: r["email"] for r in report["rejected"]}
    assert by_row[2] == "not-an-email" and by_row[3] is None and by_row[8] == "OK1@example.com"
    assert by_row[11] == "ok8@example.com"
    assert ok(await client.get("/contacts/existing@example.com"))["first_name"] == "New"
    assert_error(await client.get("/contacts/ok2@example.com"), 404, "NOT_FOUND")


async def test_an_import_cannot_opt_in_a_number_whose_stop_stands(
    client: httpx.AsyncClient
) -> None:
    """As POST and PATCH /contacts: a number that replied STOP is opted out
    whatever the row says, and a row opting it in is rejected alone."""
    stop = ok(await client.post("/suppressions", json={
        "address": "+14155550100", "reason": "sms_opt_out"}), 201)
    await create(client, email="kept@example.com", phone="+14155550100")
    await create(client, email="moves@example.com", phone="+14155550199",
                 sms_consent_status="opted_in", sms_consent_source="signup form")
    report = await import_json(client, [
        {"email": "new@example.com", "phone": "+1 415 555 0100"},
        {"email": "in@example.com", "phone": "+14155550100", "sms_consent_status": "opted_in"},
        {"email": "kept@example.com", "sms_consent_status": "opted_in"},
        {"email": "moves@example.com", "phone": "+14155550100"},
        {"email": "out@example.com", "phone": "+14155550100",
         "sms_consent_status": "opted_out", "sms_consent_source": "paper form"},
        {"email": "other@example.com", "phone": "+14155550101",
         "sms_consent_status": "opted_in"},
    ])
    assert (report["created"], report["updated"]) == (3, 1)
    reasons = rejections(report)
    assert sorted(reasons) == [2, 3]
    for row in (2, 3):
        assert reasons[row].startswith("sms_consent_status: the number replied STOP ("), reasons
    assert_error(await client.get("/contacts/in@example.com"), 404, "NOT_FOUND")
    stop_at = stop["sms_opted_out_at"]
    for email in ("new@example.com", "kept@example.com", "moves@example.com"):
        contact = ok(await client.get(f"/contacts/{email}"))
        assert (contact["sms_consent_status"], contact["sms_consent_source"]) == (
            "opted_out", "keyword"), email
        assert contact["sms_consent_updated_at"] == stop_at, email
    out = ok(await client.get("/contacts/out@example.com"))
    assert (out["sms_consent_status"], out["sms_consent_source"]) == ("opted_out", "paper form")
    other = ok(await client.get("/contacts/other@example.com"))
    assert other["sms_consent_status"] == "opted_in"


async def test_a_consent_source_without_a_status_is_rejected_as_by_post(
    client: httpx.AsyncClient
) -> None:
    body = [
        {"email": "a@example.com", "sms_consent_source": "signup form"},
        {"email": "b@example.com", "sms_consent_status": "unknown", "sms_consent_source": "x"},
        {"email": "c@example.com", "sms_consent_status": "opted_in", "sms_consent_source": "x"},
    ]
    report = await import_json(client, body)
    expected = "sms_consent_source: is only accepted with an sms_consent_status other than unknown"
    assert rejections(report) == {1: expected, 2: expected}
    assert report["created"] == 1
    csv = "email,sms_consent_status,sms_consent_source\nd@example.com,,paper\n"
    assert rejections(await import_csv(client, csv)) == {1: expected}
    single = await client.post("/contacts", json=body[0])
    assert "sms_consent_source" in assert_error(single, 400, "BAD_REQUEST")


async def test_emails_are_matched_as_the_database_folds_case(
    client: httpx.AsyncClient, service: Service
) -> None:
    """U+0130 (İ) lowercases differently in Python and in PostgreSQL: an import
    counts, matches and refuses repeated emails the way the unique index on
    the email folds case."""
    single = await import_json(client, [{"email": "İx@example.com"}])
    assert (single["created"], single["updated"], single["rejected_count"]) == (1, 0, 0)
    contact = ok(await client.get("/contacts/İx@example.com"))
    again = await import_json(client, [{"email": "İX@example.com", "first_name": "Ix"}])
    assert (again["created"], again["updated"]) == (0, 1)
    assert ok(await client.get(f"/contacts/{contact['id']}"))["first_name"] == "Ix"

    # Pairs that Python and PostgreSQL may fold apart (depending on the
    # database's locale): the second row is a repeat exactly when PostgreSQL
    # takes them for the same address.
    pairs = [("İa@example.com", "ia@example.com"), ("İb@example.com", "i\u0307b@example.com"),
             ("İc@example.com", "İC@example.com")]
    for first, second in pairs:
        async with service.db.acquire() as conn:
            same = await conn.fetchval("SELECT lower($1) = lower($2)", first, second)
        report = await import_json(client, [{"email": first}, {"email": second}])
        created = ok(await client.get(f"/contacts/{first}"))
        if same:
            assert (report["created"], report["updated"]) == (1, 0), (first, second)
            assert "repeats row 1" in rejections(report)[2]
            assert ok(await client.get(f"/contacts/{second}")) == created
        else:
            assert (report["created"], report["updated"]) == (2, 0), (first, second)
            assert report["rejected_count"] == 0
            assert ok(await client.get(f"/contacts/{second}"))["id"] != created["id"]


async def test_csv_import(client: httpx.AsyncClient) -> None:
    await define(client, key="plan", type="string")
    await define(client, key="seats", type="number")
    await define(client, key="vip", type="boolean")
    await define(client, key="renews", type="date")
    await create(client, email="ada@example.com", first_name="Ada", last_name="Byron",
                 properties={"plan": "free"})
    text = (
        "\ufeffEmail, First_Name ,last_name,phone,unsubscribed,plan,seats,vip,renews\n"
        "ADA@example.com,,Lovelace,,,pro,3,yes,2027-01-31\n"
        '"grace@example.com","Grace ""Amazing""","Hopper, USN",+1 415 555 0100,true,,,,\n'
        "\n"
        # Spaces around a number, a boolean or a date are let go alike.
        "alan@example.com,Alan,\"Turing\nof Bletchley\",,no,, 1.5 , 0 , 2028-03-01 \n"
        "bad-row@example.com,too,few\n"
        "x@example.com,,,,maybe,,,,\n"
        "y@example.com,,,,,,ten,,\n"
        "z@example.com,,,,,,,,2027-02-30\n"
    )
    report = await import_csv(client, text)
    assert (report["rows"], report["created"], report["updated"]) == (7, 2, 1)
    reasons = rejections(report)
    assert sorted(reasons) == [4, 5, 6, 7]
    assert "has 3 fields, the header has 9" in reasons[4]
    assert reasons[5].startswith("unsubscribed: must be true or false")
    assert reasons[6].startswith("properties.seats: must be a number")
    assert reasons[7].startswith("properties.renews: must be a date")
    assert report["rejected"][0]["email"] == "bad-row@example.com"

    ada = ok(await client.get("/contacts/ada@example.com"))
    assert (ada["first_name"], ada["last_name"]) == ("Ada", "Lovelace")  # empty cell: kept
    assert ada["properties"] == {"plan": "pro", "seats": 3, "vip": True, "renews": "2027-01-31"}
    grace = ok(await client.get("/contacts/grace@example.com"))
    assert (grace["first_name"], grace["last_name"]) == ('Grace "Amazing"', "Hopper, USN")
    assert grace["unsubscribed"] is True and grace["normalized_phone"] == "+14155550100"
    alan = ok(await client.get("/contacts/alan@example.com"))
    assert alan["last_name"] == "Turing\nof Bletchley"
    assert alan["properties"] == {"seats": 1.5, "vip": False, "renews": "2028-03-01"}


async def test_bodies_refused_as_a_whole(client: httpx.AsyncClient) -> None:
    csv_refusals = [
        ("first_name\nAda\n", 400, "email column"),
        ("email,email\na@example.com,b@example.com\n", 400, "twice"),
        ("email,,first_name\n", 400, "no name"),
        ("email,color,size\na@example.com,red,L\n", 422, "'color', 'size'"),
        ("", 400, "empty"),
        ("email\n\x00\n", 400, "NUL"),
    ]
    for text, status, needle in csv_refusals:
        response = await client.post("/contacts/import", content=text.encode(), headers=CSV)
        code = "BAD_REQUEST" if status == 400 else "UNPROCESSABLE_ENTITY"
        assert needle in assert_error(response, status, code), text
    refusals = [
        (b"", "application/json", "required"),
        (b"[{", "application/json", "not valid JSON"),
        (b'{"email": "a@example.com"}', "application/json", "email"),
        (b'{"contacts": [], "color": 1}', "application/json", "color"),
        (b'{"contacts": [], "segment_id": "S1"}', "application/json", "segment_id"),
        (b'"a@example.com"', "application/json", "JSON array"),
        (b'[{"email": "a@example.com", "email": "b@example.com"}]', "application/json",
         "email: is given more than once"),
        (b"email\na@example.com\n", "application/xml", "Content-Type"),
        (b"email\n\xff\n", "text/csv", "UTF-8"),
    ]
    for content, content_type, needle in refusals:
        response = await client.post(
            "/contacts/import", content=content, headers={"Content-Type": content_type}
        )
        assert needle in assert_error(response, 400, "BAD_REQUEST"), content
    assert ok(await client.get("/contacts"))["data"] == []


async def test_import_into_a_segment(client: httpx.AsyncClient) -> None:
    segment = await make(client, "/segments", name="Imported")
    already = await create(client, email="ada@example.com")
    ok(await client.post(f"/contacts/{already['id']}/segments/{segment['id']}"))

    by_query = await import_csv(
        client, "email\nada@example.com\ngrace@example.com\nbad\n", segment_id=segment["id"]
    )
    assert (by_query["created"], by_query["updated"], by_query["rejected_count"]) == (1, 1, 1)
    assert by_query["segment_id"] == segment["id"] and by_query["added_to_segment"] == 1
    by_field = await import_json(client, {"segment_id": segment["id"], "contacts": [
        {"email": "alan@example.com"}, {"email": "grace@example.com"},
    ]})
    assert by_field["added_to_segment"] == 1
    assert ok(await client.get(f"/segments/{segment['id']}"))["contact_count"] == 3
    same = await import_json(client, {"segment_id": segment["id"], "contacts": []},
                             segment_id=segment["id"])
    assert (same["rows"], same["created"]) == (0, 0)

    other = await make(client, "/segments", name="Other")
    clash = await client.post("/contacts/import", params={"segment_id": other["id"]},
                              json={"segment_id": segment["id"], "contacts": []})
    assert "segment_id" in assert_error(clash, 400, "BAD_REQUEST")
    for params, body in [
        ({"segment_id": str(uuid.uuid4())}, [{"email": "new@example.com"}]),
        ({}, {"segment_id": str(uuid.uuid4()), "contacts": [{"email": "new@example.com"}]}),
    ]:
        missing = await client.post("/contacts/import", params=params, json=body)
        assert "segment" in assert_error(missing, 404, "NOT_FOUND")
    # Nothing was imported by the refused requests.
    assert_error(await client.get("/contacts/new@example.com"), 404, "NOT_FOUND")
    bad = await client.post("/contacts/import", params={"segment_id": "x"}, json=[])
    assert "segment_id" in assert_error(bad, 400, "BAD_REQUEST")


async def test_an_import_racing_deletions_is_200_or_404(client: httpx.AsyncClient) -> None:
    """An import into a segment that is deleted meanwhile, of contacts deleted
    meanwhile, answers 200 (it came first) or 404 naming the segment; never 500."""
    statuses: list[int] = []

    async def run_import(segment_id: str, rows: list[dict[str, Any]]) -> None:
        response = await client.post(
            "/contacts/import", params={"segment_id": segment_id}, json=rows
        )
        statuses.append(response.status_code)
        if response.status_code != 200:
            assert "segment" in assert_error(response, 404, "NOT_FOUND")

    async def delete(path: str) -> None:
        ok(await client.delete(path), 204)

    for round_ in range(6):
        segment = await make(client, "/segments", name=f"Doomed {round_}")
        contacts = [await create(client, email=f"r{round_}.{n}@example.com") for n in range(3)]
        rows = [{"email": c["email"]} for c in contacts] + [{"email": f"new{round_}@example.com"}]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_import, segment["id"], rows)
            nursery.start_soon(delete, f"/contacts/{contacts[0]['id']}")
            nursery.start_soon(run_import, segment["id"], rows[1:])
            nursery.start_soon(delete, f"/segments/{segment['id']}")
    assert set(statuses) <= {200, 404}


async def test_an_import_replays_under_its_idempotency_key(client: httpx.AsyncClient) -> None:
    body = [{"email": "ada@example.com"}, {"email": "grace@example.com"}]
    headers = {"Idempotency-Key": "import-1"}
    first = await client.post("/contacts/import", json=body, headers=headers)
    again = await client.post("/contacts/import", json=body, headers=headers)
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.content == first.content and ok(first)["created"] == 2


async def test_at_most_50000_rows(client: httpx.AsyncClient) -> None:
    rows = [{"email": f"u{n}@example.com"} for n in range(50_001)]
    message = assert_error(
        await client.post("/contacts/import", json=rows), 413, "PAYLOAD_TOO_LARGE"
    )
    assert "50000" in message and "50001" in message
    text = "email\n" + "".join(f"u{n}@example.com\n" for n in range(50_001))
    response = await client.post("/contacts/import", content=text.encode(), headers=CSV)
    assert "50001" in assert_error(response, 413, "PAYLOAD_TOO_LARGE")
    assert ok(await client.get("/contacts"))["data"] == []


@pytest.fixture
def config_changes() -> dict[str, Any]:
    """Settings a test changes; tests override it with ``parametrize``."""
    return {}


@pytest.fixture
def config(config: Config, config_changes: dict[str, Any]) -> Config:
    return config.with_(**config_changes)


@pytest.mark.parametrize(
    "config_changes", [{"max_body_bytes": 1024, "import_max_body_bytes": 4096}], ids=["small"]
)
async def test_the_import_has_its_own_body_limit(client: httpx.AsyncClient) -> None:
    header = "email,first_name\n"
    row = "someone@example.com,Someone\n"
    within = (header + row * ((4096 - len(header)) // len(row))).encode()
    assert 1024 < len(within) <= 4096
    report = ok(await client.post("/contacts/import", content=within, headers=CSV))
    assert report["rows"] == (len(within) - len(header)) // len(row)

    over = within + row.encode() * 3
    message = assert_error(
        await client.post("/contacts/import", content=over, headers=CSV), 413, "PAYLOAD_TOO_LARGE"
    )
    assert "4096" in message

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(over), 500):
            yield over[start : start + 500]

    streamed = await client.post("/contacts/import", content=chunks(), headers=CSV)
    assert "content-length" not in streamed.request.headers
    assert_error(streamed, 413, "PAYLOAD_TOO_LARGE")
    # Other routes keep the general limit.
    padded = b'{"email": "pad@example.com"' + b" " * 2000 + b"}"
    json_type = {"Content-Type": "application/json"}
    message = assert_error(
        await client.post("/contacts", content=padded, headers=json_type), 413, "PAYLOAD_TOO_LARGE"
    )
    assert "1024" in message


# --- the command line ------------------------------------------------------------------------


async def test_cli_import_posts_the_file_in_batches(
    client: httpx.AsyncClient, base_url: str, acme: Credential, tmp_path: Path
) -> None:
    await define(client, key="plan", type="string")
    segment = await make(client, "/segments", name="From the CLI")
    await create(client, email="ada@example.com", first_name="Ada")
    path = tmp_path / "contacts.csv"
    path.write_text(
        "email,last_name,plan\n"
        "ada@example.com,Lovelace,pro\n"
        "grace@example.com,Hopper,\n"
        "ada@EXAMPLE.com,Again,\n"
        "not an email,,\n"
        "alan@example.com,Turing,free\n"
        "edsger@example.com,Dijkstra,pro\n"
        "barbara@example.com,Liskov,team\n"
        "grace@example.com,Hopper-Murray,\n"
    )
    done = await tidings(
        "contacts", "import", str(path), "--team-token", acme.secret,
        "--segment-id", segment["id"], "--url", base_url, "--batch-size", "3",
    )
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.decode().strip().splitlines()
    assert len(lines) == 1
    report = json.loads(lines[0])
    assert report["requests"] == 3
    assert (report["rows"], report["created"], report["updated"]) == (8, 4, 2)
    assert report["rejected_count"] == 2
    # Row numbers count from the top of the file, across batches.
    assert [r["row"] for r in report["rejected"]] == [3, 4]
    assert "repeats row 1" in report["rejected"][0]["reason"]
    assert "email" in report["rejected"][1]["reason"]
    # A repeat in a later batch is an update.
    grace = ok(await client.get("/contacts/grace@example.com"))
    assert grace["last_name"] == "Hopper-Murray"
    assert ok(await client.get(f"/segments/{segment['id']}"))["contact_count"] == 5
    ada = ok(await client.get("/contacts/ada@example.com"))
    assert (ada["first_name"], ada["last_name"], ada["properties"]) == (
        "Ada", "Lovelace", {"plan": "pro"}
    )

    as_json = tmp_path / "more.json"
    as_json.write_text(json.dumps([{"email": "ken@example.com", "properties": {"plan": "pro"}}]))
    done = await tidings("contacts", "import", str(as_json), "--team-token", acme.secret,
                         "--url", base_url)
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout)["created"] == 1


async def test_cli_import_failures(base_url: str, acme: Credential, tmp_path: Path) -> None:
    path = tmp_path / "contacts.csv"
    path.write_text("email\nada@example.com\n")
    refused = await tidings("contacts", "import", str(path), "--team-token", "svc_team_nope",
                            "--url", base_url)
    assert refused.returncode == 1
    assert "401 UNAUTHORIZED" in refused.stderr.decode()
    missing_segment = await tidings("contacts", "import", str(path), "--team-token", acme.secret,
                                    "--url", base_url, "--segment-id", str(uuid.uuid4()))
    assert missing_segment.returncode == 1
    assert "404 NOT_FOUND" in missing_segment.stderr.decode()
    no_file = await tidings("contacts", "import", str(tmp_path / "none.csv"),
                            "--team-token", acme.secret, "--url", base_url)
    assert no_file.returncode == 1 and "cannot read" in no_file.stderr.decode()
    assert refused.stdout == missing_segment.stdout == no_file.stdout == b""


def test_cli_batch_size_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "contacts.csv"
    path.write_text("email\nada@example.com\n")
    for size in ("0", "50001"):
        with pytest.raises(SystemExit, match="--batch-size must be 1 to 50000"):
            cli.main(["contacts", "import", str(path), "--team-token", "svc_team_x",
                      "--batch-size", size])


async def test_cli_import_cut_off_mid_file_says_which_rows_were_imported(tmp_path: Path) -> None:
    """The service goes away after the first request: the rows it imported
    are named, and the ones whose request got no answer."""
    answered = 0

    async def respond(_request: Received) -> Answer:
        nonlocal answered
        answered += 1
        if answered > 1:
            raise HangUp
        report = {"rows": 2, "created": 2, "updated": 0, "rejected_count": 0, "rejected": [],
                  "added_to_segment": 0}
        return 200, json.dumps({"success": True, "data": report}).encode(), {}

    path = tmp_path / "contacts.csv"
    path.write_text("email\n" + "".join(f"r{n}@example.com\n" for n in range(5)))
    receiver = Receiver(respond)
    async with trio.open_nursery() as nursery:
        await nursery.start(receiver.serve)
        base = receiver.url.removesuffix("/hook")
        with pytest.raises(importing.ImportFailed) as failed:
            await trio.to_thread.run_sync(
                partial(importing.import_file, path, base, "svc_team_x", None, batch_size=2))
        nursery.cancel_scope.cancel()
    assert "rows 1 to 2 were imported; rows 3 to 4 may or may not have been" in str(failed.value)
