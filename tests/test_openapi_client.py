"""A client generated from GET /openapi.json by openapi-python-client works.

The generator runs on the served document; the generated package then calls
every list route (and creates a contact with only an email) against the real
server, parsing each answer into its generated models.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.conftest import Credential, MakeToken
from tidings.config import Config
from tidings.http.app import all_routes

PACKAGE = "tidings_generated_client"


@pytest.fixture
def config(config: Config) -> Config:
    # A webhook endpoint on loopback, so that its routes have an id to list.
    return config.with_(webhook_allow_private_urls=True)


async def generate(http: httpx.AsyncClient, where: Path) -> Any:
    spec = where / "openapi.json"
    spec.write_bytes((await http.get("/openapi.json")).content)
    settings = where / "generator.yaml"
    settings.write_text(f"post_hooks: []\npackage_name_override: {PACKAGE}\n")
    output = where / PACKAGE
    done = await trio.run_process(
        [
            sys.executable, "-m", "openapi_python_client", "generate", "--path", str(spec),
            "--output-path", str(output), "--meta", "none", "--config", str(settings),
        ],
        capture_stdout=True, stderr=subprocess.STDOUT, check=False,
    )
    assert done.returncode == 0, done.stdout.decode()
    sys.path.insert(0, str(where))
    try:
        return importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(where))


def _operation(package: Any, tag: str, operation_id: str) -> Any:
    """The generated module of an operation, in whichever folder its tag became."""
    api = Path(package.__file__).parent / "api"
    [folder] = [found.parent.name for found in api.glob(f"*/{operation_id}.py")]
    return importlib.import_module(f"{package.__name__}.api.{folder}.{operation_id}")


async def test_a_generated_client_reads_every_list_route(
    http: httpx.AsyncClient,
    client: httpx.AsyncClient,
    acme: Credential,
    make_token: MakeToken,
    tmp_path: Path,
) -> None:
    package = await generate(http, tmp_path)
    models = importlib.import_module(f"{package.__name__}.models")
    # A step-up token of the same team, so that GET /tokens answers too.
    step_up = await make_token(team="acme", step_up=True)
    api = package.AuthenticatedClient(base_url=str(http.base_url), token=step_up.secret)

    created = await _operation(package, "contacts", "create_contact").asyncio_detailed(
        client=api, body=models.CreateContact(email="ada@example.com")
    )
    assert created.status_code == 201, created.content
    contact_id = created.parsed.data.id
    segment = await client.post("/segments", json={"name": "all"})
    template = await client.post(
        "/templates", json={"name": "hi", "subject": "Hi", "html": "<p>Hi</p>"}
    )
    endpoint = await client.post(
        "/webhook-endpoints", json={"url": "http://127.0.0.1:9/hook", "events": ["*"]}
    )
    ids: dict[str, Any] = {
        "contact_id": str(contact_id),
        "segment_id": segment.json()["data"]["id"],
        "template": template.json()["data"]["id"],
        "endpoint_id": endpoint.json()["data"]["id"],
    }
    document = (await http.get("/openapi.json")).json()
    listed = 0
    for path, methods in document["paths"].items():
        operation = methods.get("get")
        if operation is None:
            continue
        data = operation["responses"]["200"]["content"]
        schema = data.get("application/json", {}).get("schema", {})
        ref = schema.get("properties", {}).get("data", {}).get("$ref", "")
        if not ref.endswith("List"):
            continue
        listing = document["components"]["schemas"][ref.rpartition("/")[2]]
        if "has_more" not in listing["properties"]:
            continue  # an email's events: {object, data} as the spec shows
        tag = operation["tags"][0].lower().replace(" ", "_")
        module = _operation(package, tag, operation["operationId"])
        params = {name: ids[name] for name in ids if "{" + name + "}" in path}
        answer = await module.asyncio_detailed(client=api, **params)
        assert answer.status_code == 200, (path, answer.content)
        page = answer.parsed.data
        assert page.object_ == "list", path
        assert isinstance(page.data, list) and isinstance(page.has_more, bool), path
        listed += 1
    names = [
        getattr(route.response, "__name__", "") for route in all_routes()
        if route.method == "GET" and "has_more" in getattr(route.response, "model_fields", {})
    ]
    assert listed == sum(1 for name in names if name.endswith("List"))
    assert listed >= 15
