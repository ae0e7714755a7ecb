"""Contacts: list with filters, get by id or email, PATCH, DELETE, consent
tracking and property values."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from tests.conftest import MakeToken, assert_error
from tests.http.audience import create, ok


async def emails(client: httpx.AsyncClient, **params: Any) -> list[str]:
    listed = ok(await client.get("/contacts", params=params))
    return [contact["email"] for contact in listed["data"]]


# --- create -------------------------------------------------------------------------


async def test_create_refusals_name_the_field(client: httpx.AsyncClient) -> None:
    refusals = [
        ({"email": "not-an-email"}, "email"),
        ({"email": "ada@"}, "email"),
        ({"email": "ada lovelace@example.com"}, "email"),
        ({"email": "ada@example..com"}, "email"),
        ({"email": "a" * 65 + "@example.com"}, "email"),  # RFC 5321: 64 octets at most
        ({"phone": "+14155550123", "sms_consent_status": "maybe"}, "sms_consent_status"),
        ({"phone": "+14155550123", "sms_consent_status": "OPTED_IN"}, "sms_consent_status"),
        ({"email": "a@example.com", "first_name": "x" * 256}, "first_name"),
        ({"email": "a@example.com", "last_name": "x" * 256}, "last_name"),
    ]
    for body, field in refusals:
        message = assert_error(await client.post("/contacts", json=body), 400, "BAD_REQUEST")
        assert f"{field}: " in message, (body, message)
    assert ok(await client.get("/contacts"))["data"] == []

    longest = await create(client, email="a@example.com", first_name="f" * 255,
                           last_name="l" * 255)
    assert (longest["first_name"], longest["last_name"]) == ("f" * 255, "l" * 255)
    assert (await create(client, email="a" * 64 + "@example.com"))["email"].startswith("a" * 64)


# --- list ----------------------------------------------------------------------------


async def test_list_is_newest_first_and_paged(client: httpx.AsyncClient) -> None:
    for n in range(3):
        await create(client, email=f"p{n}@example.com")
    first = ok(await client.get("/contacts", params={"limit": 2}))
    assert [c["email"] for c in first["data"]] == ["p2@example.com", "p1@example.com"]
    assert first["has_more"] is True and first["object"] == "list"
    rest = ok(await client.get("/contacts", params={"limit": 2, "offset": 2}))
    assert [c["email"] for c in rest["data"]] == ["p0@example.com"]
    assert rest["has_more"] is False


async def test_list_filters(client: httpx.AsyncClient) -> None:
    await create(client, email="ada@example.com", first_name="Ada", last_name="Lovelace")
    await create(client, email="grace@navy.example", first_name="Grace", last_name="Hopper",
                 unsubscribed=True)
    await create(client, email="alan_t@example.org", first_name="Alan", last_name="Turing")
    await create(client, phone="+14155550100", first_name="Phone", last_name="Only")

    assert await emails(client, email="ADA@example.COM") == ["ada@example.com"]
    assert await emails(client, email="nobody@example.com") == []
    assert await emails(client, unsubscribed="true") == ["grace@navy.example"]
    assert set(await emails(client, unsubscribed="false")) == {
        "ada@example.com", "alan_t@example.org", None
    }
    assert await emails(client, search="HOPP") == ["grace@navy.example"]  # last name
    assert await emails(client, search="navy") == ["grace@navy.example"]  # email
    assert await emails(client, search="ada lov") == ["ada@example.com"]  # full name
    assert await emails(client, search="only") == [None]
    # LIKE wildcards are taken literally.
    assert await emails(client, search="_") == ["alan_t@example.org"]
    assert await emails(client, search="%") == []
    assert await emails(client, search="a", unsubscribed="false", email="ada@example.com") == [
        "ada@example.com"
    ]


async def test_list_by_segment(client: httpx.AsyncClient) -> None:
    inside = await create(client, email="in@example.com", first_name="Ina")
    await create(client, email="out@example.com")
    segment = ok(await client.post("/segments", json={"name": "Insiders"}), 201)
    ok(await client.post(f"/contacts/{inside['id']}/segments/{segment['id']}"))
    assert await emails(client, segment_id=segment["id"]) == ["in@example.com"]
    assert await emails(client, segment_id=segment["id"], search="ina") == ["in@example.com"]
    assert await emails(client, segment_id=segment["id"], unsubscribed="true") == []
    missing = await client.get("/contacts", params={"segment_id": str(uuid.uuid4())})
    assert "segment" in assert_error(missing, 404, "NOT_FOUND")
    # An id in a query is written as in a path: one request, one fingerprint.
    assert await emails(client, segment_id=segment["id"].upper()) == ["in@example.com"]
    hexed = uuid.UUID(segment["id"]).hex
    for spelling in ("{" + segment["id"] + "}", f"urn:uuid:{segment['id']}", hexed):
        other = await client.get("/contacts", params={"segment_id": spelling})
        assert "8-4-4-4-12" in assert_error(other, 400, "BAD_REQUEST"), spelling


async def test_list_rejects_bad_filters(client: httpx.AsyncClient) -> None:
    refusals = [
        ({"unsubscribed": "perhaps"}, "unsubscribed"),
        ({"segment_id": "nope"}, "segment_id"),
        ({"search": ""}, "search"),
        ({"search": "x" * 201}, "search"),
        ({"search": "a\x00"}, "search"),
        ({"color": "red"}, "color"),
    ]
    for params, field in refusals:
        message = assert_error(await client.get("/contacts", params=params), 400, "BAD_REQUEST")
        assert field in message, params


# --- get by id or email ---------------------------------------------------------------------


async def test_get_by_email_case_insensitively(client: httpx.AsyncClient) -> None:
    contact = await create(client, email="Ada.Lovelace+news@Example.com")
    assert contact["email"] == "Ada.Lovelace+news@example.com"
    for ref in ("Ada.Lovelace+news@example.com", "ada.lovelace+NEWS@EXAMPLE.COM", contact["id"]):
        assert ok(await client.get(f"/contacts/{ref}")) == contact
    assert_error(await client.get("/contacts/nobody@example.com"), 404, "NOT_FOUND")
    message = assert_error(await client.get("/contacts/ada-lovelace"), 400, "BAD_REQUEST")
    assert "contact_id" in message


async def test_an_email_is_case_folded_as_the_database_does(client: httpx.AsyncClient) -> None:
    """U+0130 (İ) lowercases differently in Python and in PostgreSQL; every
    lookup folds case the way the unique index on the email does."""
    contact = await create(client, email="İx@example.com")
    for ref in ("İx@example.com", "İX@EXAMPLE.com", contact["id"]):
        assert ok(await client.get(f"/contacts/{ref}")) == contact
    assert await emails(client, email="İX@example.com") == ["İx@example.com"]
    patched = ok(await client.patch("/contacts/İX@example.com", json={"first_name": "Ix"}))
    assert patched["id"] == contact["id"]
    taken = await client.post("/contacts", json={"email": "İX@Example.com"})
    assert "email" in assert_error(taken, 409, "CONFLICT")
    ok(await client.delete("/contacts/İX@example.com"), 204)
    assert_error(await client.get(f"/contacts/{contact['id']}"), 404, "NOT_FOUND")


async def test_an_email_naming_a_contact_is_normalised_as_a_stored_one(
    client: httpx.AsyncClient,
) -> None:
    """A path or the email filter finds the contact under every spelling that
    creating it would refuse as taken: the Unicode composed (NFC) or not, an
    internationalised domain in its Unicode or its xn-- form."""
    composed = "zo\u00eb@example.com"  # ë as one code point, as stored
    decomposed = "zoe\u0308@example.com"  # e + combining diaeresis
    zoe = await create(client, email=decomposed)
    assert zoe["email"] == composed
    taken = await client.post("/contacts", json={"email": decomposed})
    assert "email" in assert_error(taken, 409, "CONFLICT")
    assert ok(await client.get(f"/contacts/{decomposed}")) == zoe
    assert await emails(client, email=decomposed) == [composed]
    assert await emails(client, email=decomposed.upper()) == [composed]
    patched = ok(await client.patch(f"/contacts/{decomposed}", json={"first_name": "Zoë"}))
    assert patched["id"] == zoe["id"]
    segment = ok(await client.post("/segments", json={"name": "S"}), 201)
    joined = await client.post(f"/contacts/{decomposed}/segments/{segment['id']}")
    assert ok(joined)["id"] == segment["id"]
    assert await emails(client, email=decomposed, segment_id=segment["id"]) == [composed]
    assert ok(await client.get(f"/contacts/{decomposed}/topics"))["data"] == []

    ascii_form = "p@xn--exmple-cua.com"
    p = await create(client, email=ascii_form)
    assert p["email"] == "p@ex\u00e4mple.com"
    for ref in (ascii_form, "p@XN--EXMPLE-CUA.COM", p["email"]):
        assert ok(await client.get(f"/contacts/{ref}")) == p, ref
        assert await emails(client, email=ref) == [p["email"]], ref
    patched = ok(await client.patch(f"/contacts/{ascii_form}", json={"last_name": "P"}))
    assert patched["id"] == p["id"]

    # A value that is not an address is looked up as given: it names nobody.
    for ref in ("a@@example.com", "zoe@", "@example.com"):
        assert_error(await client.get(f"/contacts/{ref}"), 404, "NOT_FOUND")
        assert await emails(client, email=ref) == []

    ok(await client.delete(f"/contacts/{decomposed}"), 204)
    ok(await client.delete(f"/contacts/{ascii_form}"), 204)
    assert ok(await client.get("/contacts"))["data"] == []


# --- PATCH -----------------------------------------------------------------------------


async def test_patch_changes_only_what_is_given(client: httpx.AsyncClient) -> None:
    contact = await create(client, email="ada@example.com", first_name="Ada", last_name="Byron")
    patched = ok(await client.patch(f"/contacts/{contact['id']}", json={"last_name": "Lovelace"}))
    assert patched["last_name"] == "Lovelace"
    assert patched["first_name"] == "Ada" and patched["email"] == "ada@example.com"
    assert patched["updated_at"] > contact["updated_at"]
    assert patched["created_at"] == contact["created_at"]

    cleared = ok(await client.patch(
        "/contacts/ADA@example.com", json={"first_name": None, "phone": "+44 20 7946 0958"}
    ))
    assert cleared["first_name"] is None
    assert cleared["phone"] == "+44 20 7946 0958"
    assert (cleared["normalized_phone"], cleared["phone_country"]) == ("+442079460958", "GB")

    moved = ok(await client.patch(
        f"/contacts/{contact['id']}", json={"email": "Countess@Example.com", "unsubscribed": True}
    ))
    assert moved["email"] == "Countess@example.com" and moved["unsubscribed"] is True
    no_phone = ok(await client.patch(f"/contacts/{contact['id']}", json={"phone": None}))
    assert (no_phone["phone"], no_phone["normalized_phone"], no_phone["phone_country"]) == (
        None, None, None
    )
    assert ok(await client.get(f"/contacts/{contact['id']}")) == no_phone


async def test_patch_refusals(client: httpx.AsyncClient) -> None:
    contact = await create(client, email="ada@example.com")
    await create(client, email="grace@example.com")
    path = f"/contacts/{contact['id']}"

    taken = await client.patch(path, json={"email": "GRACE@example.com"})
    assert "email" in assert_error(taken, 409, "CONFLICT")
    alone = await client.patch(path, json={"email": None})
    message = assert_error(alone, 422, "UNPROCESSABLE_ENTITY")
    assert "email" in message and "phone" in message
    refusals = [
        ({}, "at least one field"),
        ({"email": "not-an-email"}, "email"),
        ({"phone": "12"}, "phone"),
        ({"phone": "+1 555"}, "phone"),
        ({"unsubscribed": None}, "unsubscribed"),
        ({"unsubscribed": "yes"}, "unsubscribed"),
        ({"sms_consent_status": None}, "sms_consent_status"),
        ({"sms_consent_status": "maybe"}, "sms_consent_status"),
        ({"sms_consent_source": "import"}, "sms_consent_source"),
        ({"properties": None}, "properties"),
        ({"first_name": "x" * 256}, "first_name"),
        ({"nickname": "Ada"}, "nickname"),
    ]
    for body, needle in refusals:
        message = assert_error(await client.patch(path, json=body), 400, "BAD_REQUEST")
        assert needle in message, (body, message)
    assert ok(await client.get(path)) == contact
    assert_error(
        await client.patch(f"/contacts/{uuid.uuid4()}", json={"first_name": "X"}), 404, "NOT_FOUND"
    )
    assert_error(
        await client.patch("/contacts/nobody@example.com", json={"first_name": "X"}),
        404, "NOT_FOUND",
    )


async def test_sms_consent_is_stamped_when_it_changes_and_only_then(
    client: httpx.AsyncClient,
) -> None:
    contact = await create(client, phone="+14155550100")
    assert contact["sms_consent_status"] == "unknown"
    assert contact["sms_consent_updated_at"] is None and contact["sms_consent_source"] is None
    path = f"/contacts/{contact['id']}"

    opted_in = ok(await client.patch(
        path, json={"sms_consent_status": "opted_in", "sms_consent_source": "keyword"}
    ))
    assert opted_in["sms_consent_status"] == "opted_in"
    assert opted_in["sms_consent_source"] == "keyword"
    assert opted_in["sms_consent_updated_at"] is not None

    # The same status again, or another field: the stamp stays.
    same = ok(await client.patch(
        path, json={"sms_consent_status": "opted_in", "sms_consent_source": "form"}
    ))
    other = ok(await client.patch(path, json={"first_name": "Ada"}))
    for unchanged in (same, other):
        assert unchanged["sms_consent_source"] == "keyword"
        assert unchanged["sms_consent_updated_at"] == opted_in["sms_consent_updated_at"]

    opted_out = ok(await client.patch(path, json={"sms_consent_status": "opted_out"}))
    assert opted_out["sms_consent_source"] == "api"
    assert opted_out["sms_consent_updated_at"] > opted_in["sms_consent_updated_at"]

    created_in = await create(client, phone="+14155550101", sms_consent_status="opted_in",
                              sms_consent_source="form")
    assert created_in["sms_consent_source"] == "form"
    assert created_in["sms_consent_updated_at"] == created_in["created_at"]


async def test_create_refuses_a_consent_source_without_a_status(
    client: httpx.AsyncClient,
) -> None:
    """As PATCH does: a source describes a change of status, and a contact
    created with the status unknown has none."""
    for body in (
        {"phone": "+14155550123", "sms_consent_source": "keyword"},
        {"phone": "+14155550123", "sms_consent_status": "unknown", "sms_consent_source": "form"},
    ):
        refused = await client.post("/contacts", json=body)
        message = assert_error(refused, 400, "BAD_REQUEST")
        assert "sms_consent_source" in message and "sms_consent_status" in message, message
    assert ok(await client.get("/contacts"))["data"] == []


async def test_properties_follow_the_definitions(client: httpx.AsyncClient) -> None:
    ok(await client.post("/contact-properties", json={"key": "plan", "type": "string"}), 201)
    ok(await client.post("/contact-properties", json={"key": "seats", "type": "number"}), 201)

    unknown = await client.post(
        "/contacts", json={"email": "a@example.com", "properties": {"color": "red"}}
    )
    assert "properties.color" in assert_error(unknown, 422, "UNPROCESSABLE_ENTITY")
    wrong = await client.post(
        "/contacts", json={"email": "a@example.com", "properties": {"seats": "3"}}
    )
    assert "properties.seats" in assert_error(wrong, 422, "UNPROCESSABLE_ENTITY")

    contact = await create(client, email="a@example.com", properties={"plan": "pro", "seats": None})
    assert contact["properties"] == {"plan": "pro"}
    path = f"/contacts/{contact['id']}"
    merged = ok(await client.patch(path, json={"properties": {"seats": 3}}))
    assert merged["properties"] == {"plan": "pro", "seats": 3}
    removed = ok(await client.patch(path, json={"properties": {"plan": None}}))
    assert removed["properties"] == {"seats": 3}
    refused = await client.patch(path, json={"properties": {"plan": True}})
    assert "properties.plan" in assert_error(refused, 422, "UNPROCESSABLE_ENTITY")
    assert ok(await client.get(path))["properties"] == {"seats": 3}


# --- DELETE -----------------------------------------------------------------------------


async def test_delete_by_id_or_email(client: httpx.AsyncClient) -> None:
    ada = await create(client, email="ada@example.com")
    grace = await create(client, email="grace@example.com")
    segment = ok(await client.post("/segments", json={"name": "S"}), 201)
    for contact in (ada, grace):
        ok(await client.post(f"/contacts/{contact['id']}/segments/{segment['id']}"))

    deleted = await client.delete(f"/contacts/{ada['id']}")
    assert deleted.status_code == 204 and deleted.content == b""
    assert_error(await client.get(f"/contacts/{ada['id']}"), 404, "NOT_FOUND")
    assert_error(await client.delete(f"/contacts/{ada['id']}"), 404, "NOT_FOUND")
    ok(await client.delete("/contacts/GRACE@example.com"), 204)
    assert_error(await client.get("/contacts/grace@example.com"), 404, "NOT_FOUND")
    # Their memberships went with them.
    assert ok(await client.get(f"/segments/{segment['id']}"))["contact_count"] == 0
    # The email is free again.
    await create(client, email="ada@example.com")


# --- permissions ------------------------------------------------------------------------


async def test_reading_and_writing_need_their_permissions(
    http: httpx.AsyncClient, make_token: MakeToken
) -> None:
    reader = await make_token(permissions=["contacts:read"])
    writer = await make_token(permissions=["contacts:write"])
    some = str(uuid.uuid4())
    writes = [
        ("POST", "/contacts", {"email": "a@example.com"}),
        ("PATCH", f"/contacts/{some}", {"first_name": "A"}),
        ("DELETE", f"/contacts/{some}", None),
        ("POST", "/contacts/import", [{"email": "a@example.com"}]),
        ("POST", "/contact-properties", {"key": "k", "type": "string"}),
        ("PATCH", f"/contact-properties/{some}", {"fallback_value": None}),
        ("DELETE", f"/contact-properties/{some}", None),
        ("POST", "/topics", {"name": "T", "default_subscription": "opt_in"}),
        ("PATCH", f"/topics/{some}", {"name": "T"}),
        ("DELETE", f"/topics/{some}", None),
        ("PATCH", f"/contacts/{some}/topics", {"topics": [{"id": some, "subscription": None}]}),
        ("POST", "/segments", {"name": "S"}),
        ("DELETE", f"/segments/{some}", None),
        ("POST", f"/contacts/{some}/segments/{some}", None),
        ("DELETE", f"/contacts/{some}/segments/{some}", None),
        ("POST", "/suppressions", {"address": "a@example.com"}),
        ("DELETE", f"/suppressions/{some}", None),
    ]
    reads = [
        "/contacts", f"/contacts/{some}", f"/contacts/{some}/segments", f"/contacts/{some}/topics",
        "/contact-properties", f"/contact-properties/{some}", "/topics", f"/topics/{some}",
        "/segments", f"/segments/{some}", f"/segments/{some}/contacts", "/suppressions",
        f"/suppressions/{some}",
    ]
    for method, path, body in writes:
        response = await http.request(method, path, json=body, headers=reader.headers)
        assert "contacts:write" in assert_error(response, 403, "FORBIDDEN"), path
    for path in reads:
        response = await http.get(path, headers=writer.headers)
        assert "contacts:read" in assert_error(response, 403, "FORBIDDEN"), path
        assert (await http.get(path, headers=reader.headers)).status_code in (200, 404), path
