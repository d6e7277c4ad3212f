"""Requests generated from ``/api/openapi.json``: the admin API never answers 5xx to what a client sends.

schemathesis reads the description a real :class:`AdminApi` serves behind the
admission layer, as a control plane serves it (uvicorn on
127.0.0.1, a SQLite store in a temporary folder, an empty fleet, a reconciler, a
mirror) and sends each operation requests that fit it and requests that do not.
With the admin token every answer is below 500, conforms to the description and,
when it is a 4xx, is in the API's error shape; without it every route but the
public probes answers 401, decided before any body is read. ``LLMGW_FUZZ_EXAMPLES`` sets the examples per
operation (``make fuzz`` runs many); the counts of requests and 5xx are printed
at the end (``-s`` shows them). Every operation is fuzzed, POST
/api/agents/restart too: no agent is connected, so nothing outside this process
restarts.

The schema is built when the module loads, from the same app's description
(a test checks the server serves exactly that): schemathesis' schemas loaded from
a fixture rename pytest's node ids, which pytest 9 no longer allows.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from llmgw.controlplane.admin.admission import Admission
from llmgw.controlplane.admin.app import AdminApi
from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.mirror.blobs import BlobStore
from llmgw.store.database import Store
from llmgw.testing.admin import admin_app
from llmgw.testing.serving import served_in_thread

EXAMPLES = int(os.environ.get("LLMGW_FUZZ_EXAMPLES", "20"))
TOKEN = "llmgw-admin-fuzz"
PUBLIC = {"/healthz", "/leader"}
"""The probes that answer without the token."""
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
SEEN = {"requests": 0, "5xx": 0}

fuzz = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


def admin_server(folder: Path) -> AbstractContextManager[str]:
    """A real admin app behind the admission layer, as a control plane serves it, in a thread of its own."""

    def behind_admission(admin: AdminApi) -> Admission:
        return Admission(admin.app(), admin.state.who, body_max_bytes=8 << 20)

    return served_in_thread(lambda: admin_app(folder, token=TOKEN, front=behind_admission))


@pytest.fixture(scope="module")
def admin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with admin_server(tmp_path_factory.mktemp("admin")) as url:
        yield url
    print(f"\n/api fuzzing: {SEEN['requests']} requests, {SEEN['5xx']} answered 5xx")


def description() -> dict[str, Any]:
    """The OpenAPI description of an :class:`AdminApi` (built without a database: describing needs none)."""
    url = "sqlite+aiosqlite://"
    store = Store(create_async_engine(url), make_url(url), timeout_s=1)
    fleet = Fleet(on_ready=lambda replica, url: None, on_gone=lambda replica_id: None)

    async def keys_changed() -> None:
        return None

    admin = AdminApi(
        name="cp-fuzz",
        token_sha256="",
        store=store,
        fleet=fleet,
        reconciler=Reconciler(store, fleet),
        blobs=BlobStore(Path("unused")),
        on_keys_changed=keys_changed,
    )
    return admin.app().openapi()


DESCRIPTION = description()
schema = schemathesis.openapi.from_dict(DESCRIPTION)
STREAMS = ["/api/events"]
"""Answers that never end (server-sent events): schemathesis reads a whole body, so with the token
they are left out (tests/controlplane/test_events_api.py covers them); without it they answer 401."""


def test_the_description_fuzzed_is_the_one_served(admin_url: str) -> None:
    assert httpx.get(f"{admin_url}/api/openapi.json").json() == DESCRIPTION


def counted(response: Any) -> None:
    SEEN["requests"] += 1
    if response.status_code >= 500:
        SEEN["5xx"] += 1


def assert_error_shape(response: Any) -> None:
    """A 4xx answers ``{"error": {"message", "hint", "problems"?: [{"field", "problem"}]}}``."""
    if not 400 <= response.status_code < 500:
        return
    assert response.headers["content-type"][0].startswith("application/json"), response.text[:300]
    error = response.json()["error"]
    assert error["message"] and isinstance(error["hint"], str), error
    for problem in error.get("problems") or []:
        assert isinstance(problem["field"], str) and problem["problem"], problem


@schema.exclude(path=STREAMS).parametrize()
@fuzz
def test_with_the_token_no_answer_is_a_5xx(case: schemathesis.Case, admin_url: str) -> None:
    response = case.call(base_url=admin_url, headers={"Authorization": f"Bearer {TOKEN}"})
    counted(response)
    case.validate_response(response, checks=CHECKS)
    assert_error_shape(response)


@schema.parametrize()
@fuzz
def test_without_the_token_every_route_but_the_probes_answers_401(
    case: schemathesis.Case, admin_url: str
) -> None:
    response = case.call(base_url=admin_url)
    counted(response)
    assert response.status_code < 500 or case.path == "/leader", (response.status_code, response.text[:300])
    if case.path not in PUBLIC:
        assert_error_shape(response)
        # the admission layer refuses it from the headers alone, whatever the method, path or body
        assert response.status_code == 401, (case.method, case.path, response.status_code, response.text)
