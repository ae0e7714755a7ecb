"""GET /openapi.json describes what the server really answers.

The conformance check itself runs on every response of the ``http`` and
``client`` fixtures (tests/openapi_check.py); these tests pin the parts of
the document that generated clients depend on, and the checker.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from openapi_spec_validator import OpenAPIV31SpecValidator

from tests.conftest import Credential
from tests.openapi_check import NotInTheDocument, check_response, document
from tidings.http.app import all_routes


def _schema(ref_or_schema: dict[str, Any]) -> dict[str, Any]:
    ref = ref_or_schema.get("$ref")
    if ref is None:
        return ref_or_schema
    found: dict[str, Any] = document()["components"]["schemas"][ref.rsplit("/", 1)[1]]
    return found


def _data_schema(method: str, path: str, status: str) -> dict[str, Any]:
    response = document()["paths"][path][method]["responses"][status]
    envelope = response["content"]["application/json"]["schema"]
    return _schema(envelope["properties"]["data"])


LIST_ROUTES = [
    ("/contacts", "ContactList"),
    ("/contact-properties", "PropertyList"),
    ("/topics", "TopicList"),
    ("/segments", "SegmentList"),
    ("/suppressions", "SuppressionList"),
    ("/templates", "TemplateList"),
    ("/tokens", "TokenList"),
    ("/webhook-endpoints", "EndpointList"),
    ("/webhook-endpoints/{endpoint_id}/deliveries", "DeliveryList"),
    ("/events", "EventList"),
    ("/event-types", "EventTypeList"),
]


@pytest.mark.parametrize(("path", "name"), LIST_ROUTES)
def test_list_routes_declare_the_list_object(path: str, name: str) -> None:
    data = _data_schema("get", path, "200")
    assert data["title"] == name
    assert set(data["required"]) == {"object", "data", "has_more"}
    assert data["properties"]["object"]["const"] == "list"
    assert data["properties"]["data"]["type"] == "array"
    assert data["properties"]["has_more"]["type"] == "boolean"


def test_operation_ids_are_the_handler_names() -> None:
    ids = [
        operation["operationId"]
        for methods in document()["paths"].values()
        for operation in methods.values()
    ]
    assert len(ids) == len(set(ids)) == len(all_routes())
    assert "get_contact" in ids and "list_contacts" in ids
    doubled = [i for i in ids if re.match(r"(get|post|patch|put|delete)_\1_", i)]
    assert doubled == []


def test_405_is_declared_where_a_path_can_be_another_resource() -> None:
    paths = document()["paths"]
    for path, method in [("/emails/{email_id}", "get"), ("/sms/{sms_id}", "patch"),
                         ("/contacts/{contact_id}", "delete")]:
        assert "405" in paths[path][method]["responses"], path
    assert "405" not in paths["/templates/{template}"]["get"]["responses"]


def test_404_is_declared_where_a_body_names_resources_at_any_depth() -> None:
    """The items of POST /emails/batch name templates (``template: {id}``)."""
    paths = document()["paths"]
    for path in ("/emails", "/emails/batch"):
        assert "404" in paths[path]["post"]["responses"], path
    assert "404" not in paths["/contacts"]["post"]["responses"]


def test_the_reports_route_declares_its_own_credential_body_and_answer() -> None:
    operation = document()["paths"]["/providers/smtp/reports"]["post"]
    assert operation["security"] == [{"reportsSecret": []}]
    scheme = document()["components"]["securitySchemes"]["reportsSecret"]
    assert scheme["scheme"] == "bearer" and "TIDINGS_REPORTS_SECRET" in scheme["description"]
    assert "message/rfc822" in operation["requestBody"]["content"]
    data = _data_schema("post", "/providers/smtp/reports", "200")
    assert set(data["properties"]) == {"recorded", "reports"}
    assert {"403", "408", "413", "422"} <= set(operation["responses"])


def test_metrics_is_text_and_openapi_is_plain_json() -> None:
    metrics = document()["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain"]
    own = document()["paths"]["/openapi.json"]["get"]["responses"]["200"]["content"]
    assert own["application/json"]["schema"] == {"type": "object"}


def test_the_document_is_valid_openapi_3_1() -> None:
    """Checked by openapi-spec-validator: what generators and gateways read."""
    errors = [f"{list(e.absolute_path)}: {e.message}"
              for e in OpenAPIV31SpecValidator(document()).iter_errors()]
    assert errors == []


def test_every_operation_declares_its_errors_with_the_envelope() -> None:
    for path, methods in document()["paths"].items():
        for method, operation in methods.items():
            responses = operation["responses"]
            # 431 (headers over 16 KiB) and 501 (a method spelled "post") on any
            # request; 503 on any that may be shed or touches storage
            for status in ("431", "500", "501"):
                assert status in responses, (method, path, status)
            assert ("503" in responses) is (path not in ("/livez", "/metrics")), (method, path)
            if "requestBody" in operation:  # a body that stalls is 408
                assert "408" in responses, (method, path)
            if "security" not in operation:  # a team's token
                for status in ("400", "401", "403", "429"):
                    assert status in responses, (method, path, status)
            elif operation["security"]:  # a credential of its own, refused with 403
                assert "403" in responses, (method, path)
            if "{" in path:
                assert "404" in responses, (method, path)
            for status, response in responses.items():
                if status.startswith(("4", "5")):
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/Error"}


# Fields a body refuses as null (the model or the route answers 400), by operation,
# and fields of the same bodies that accept null (it clears them).
NEVER_NULL = {
    ("patch", "/topics/{topic_id}"): ["name", "default_subscription"],
    ("patch", "/contacts/{contact_id}"): [
        "unsubscribed", "sms_consent_status", "sms_consent_source", "properties",
    ],
    ("post", "/contacts"): ["sms_consent_source"],
    ("patch", "/templates/{template}"): ["name", "subject", "html", "variables"],
    ("patch", "/webhook-endpoints/{endpoint_id}"): ["url", "events"],
    ("patch", "/broadcasts/{broadcast_id}"): [
        "name", "segment_id", "from_email", "subject", "html", "variable_bindings",
    ],
}
NULLABLE = {
    ("patch", "/topics/{topic_id}"): ["description"],
    ("patch", "/contacts/{contact_id}"): ["email", "phone", "first_name", "last_name"],
    ("post", "/contacts"): ["email", "phone"],
    ("patch", "/templates/{template}"): ["alias", "category", "from", "reply_to", "text"],
    ("patch", "/webhook-endpoints/{endpoint_id}"): ["description"],
    ("patch", "/broadcasts/{broadcast_id}"): ["topic_id", "from_name", "text"],
}
# Bodies that refuse ``{}`` (400: give at least one field to change).
NOT_EMPTY = [
    "/topics/{topic_id}", "/contacts/{contact_id}", "/templates/{template}",
    "/broadcasts/{broadcast_id}", "/webhook-endpoints/{endpoint_id}",
]


def _body_schema(method: str, path: str) -> dict[str, Any]:
    body = document()["paths"][path][method]["requestBody"]
    return _schema(body["content"]["application/json"]["schema"])


def _admits_null(schema: dict[str, Any]) -> bool:
    """Whether a client reading ``schema`` may send null: a null type, a
    branch that admits it, or a null default."""
    kinds = schema.get("type")
    if kinds == "null" or (isinstance(kinds, list) and "null" in kinds):
        return True
    if "default" in schema and schema["default"] is None:
        return True
    branches = schema.get("anyOf", []) + schema.get("oneOf", [])
    return any(_admits_null(_schema(branch)) for branch in branches)


@pytest.mark.parametrize(("method", "path"), list(NEVER_NULL))
def test_fields_refused_as_null_are_not_declared_nullable(method: str, path: str) -> None:
    """A client generated from the document must not send the null the server
    refuses, and must still be able to send the null that clears a field."""
    properties = _body_schema(method, path)["properties"]
    nullable = [name for name in NEVER_NULL[(method, path)] if _admits_null(properties[name])]
    assert nullable == [], (method, path)
    cleared = [name for name in NULLABLE[(method, path)] if not _admits_null(properties[name])]
    assert cleared == [], (method, path)


@pytest.mark.parametrize("path", NOT_EMPTY)
def test_patch_bodies_that_refuse_nothing_declare_min_properties(path: str) -> None:
    assert _body_schema("patch", path).get("minProperties") == 1, path


async def test_declared_defaults_of_create_contact_are_accepted(
    client: httpx.AsyncClient,
) -> None:
    """A client that sends every documented default gets its contact (it used to get 400)."""
    schema = document()["components"]["schemas"]["CreateContact"]
    defaults = {
        name: prop["default"]
        for name, prop in schema["properties"].items()
        if "default" in prop and prop["default"] is not None
    }
    response = await client.post("/contacts", json={"email": "ada@example.com", **defaults})
    assert response.status_code == 201, response.text
    assert response.json()["data"]["sms_consent_status"] == "unknown"
    explicit_null = await client.post(
        "/contacts",
        json={"email": "bob@example.com", "sms_consent_status": "opted_in",
              "sms_consent_source": None},
    )
    assert explicit_null.status_code == 400, explicit_null.text


async def test_list_responses_and_raw_routes_pass_the_check(
    http: httpx.AsyncClient, client: httpx.AsyncClient, acme: Credential
) -> None:
    # Each response goes through the fixtures' check; these would fail it
    # with a document that declared the wrong shapes.
    assert (await client.get("/webhook-endpoints")).status_code == 200
    assert (await client.get("/events")).status_code == 200
    assert (await client.get("/event-types")).json()["data"]["object"] == "list"
    metrics = await http.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    assert (await http.get("/openapi.json")).json()["openapi"] == "3.1.0"


def _response(status: int, body: bytes, content_type: str = "application/json") -> httpx.Response:
    return httpx.Response(status, content=body, headers={"content-type": content_type})


def test_the_check_refuses_what_the_document_does_not_say() -> None:
    ok = b'{"success":true,"data":{"status":"ok"}}'
    check_response("GET", "/healthz", _response(200, ok))
    with pytest.raises(NotInTheDocument, match="status not declared"):
        check_response("GET", "/healthz", _response(418, b"{}"))
    with pytest.raises(NotInTheDocument, match="does not match"):
        check_response("GET", "/healthz", _response(200, b'{"success":true,"data":[]}'))
    with pytest.raises(NotInTheDocument, match="media type"):
        check_response("GET", "/metrics", _response(200, b"{}"))
    with pytest.raises(NotInTheDocument, match="not the error envelope"):
        check_response("GET", "/nowhere", _response(404, b'{"detail":"no"}'))
    listed = b'{"success":true,"data":{"object":"list","data":[{"id":1}],"has_more":false}}'
    with pytest.raises(NotInTheDocument, match="does not match"):
        check_response("GET", "/contacts", _response(200, listed))


# The operations the spec's route table shows, with its path parameter names
# (messaging-service-api.md): generated clients name their arguments after them.
SPEC_OPERATIONS = [
    ("post", "/broadcasts/{broadcast}/cancel"),
    ("post", "/broadcasts/{broadcast}/send"),
    ("get", "/contacts/{contact_id}"),
    ("post", "/contacts/{contact_id}/segments/{segment_id}"),
    ("get", "/emails/{message_id}/events"),
    ("get", "/sms"),
    ("post", "/templates"),
    ("get", "/templates/{template}/versions/{version_id}"),
    ("delete", "/webhook-endpoints/{endpoint_id}"),
]


@pytest.mark.parametrize(("method", "path"), SPEC_OPERATIONS)
def test_operations_of_the_spec_keep_its_path_parameter_names(method: str, path: str) -> None:
    operation = document()["paths"][path][method]
    named = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
    assert named == set(re.findall(r"\{(\w+)\}", path))


def test_only_probes_that_check_storage_declare_503() -> None:
    paths = document()["paths"]
    assert "503" not in paths["/livez"]["get"]["responses"]  # the event loop alone
    assert "503" not in paths["/metrics"]["get"]["responses"]
    assert "503" in paths["/healthz"]["get"]["responses"]
    assert "503" in paths["/readyz"]["get"]["responses"]


def test_402_is_declared_only_where_a_quota_is_counted() -> None:
    """Sends count against the team's quotas when accepted; cancelling,
    previewing, syncing and a broadcast's send (its fanout counts later)
    never answer 402."""
    declaring = sorted(
        f"{method.upper()} {path}"
        for path, operations in document()["paths"].items()
        for method, operation in operations.items()
        if "402" in operation["responses"]
    )
    assert declaring == ["POST /emails", "POST /emails/batch", "POST /sms"]


def test_statuses_that_say_when_to_retry_declare_retry_after() -> None:
    responses = document()["paths"]["/emails"]["post"]["responses"]
    for status in ("402", "409", "429", "503"):
        header = responses[status]["headers"]["Retry-After"]
        assert header["schema"] == {"type": "integer", "minimum": 0}
    assert "headers" not in responses["422"]
