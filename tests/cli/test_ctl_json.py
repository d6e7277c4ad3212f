"""``--json`` on ctl's listings and ``llmgw status``: JSON on stdout that reads back as the API's models."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from llmgw.adminapi.schemas import ComponentView, KeyView, QueueView, ReplicaView, StatusView
from llmgw.cli.ctl import describe_component
from llmgw.cli.main import app
from llmgw.client.admin import AdminClient
from llmgw.core.health import ComponentState
from llmgw.core.shards import FetchProgress, ReplicaPhase

from .conftest import FAILED_AT, AdminServer


def run(server: AdminServer, *args: str) -> str:
    answer = CliRunner().invoke(app, [*args, *server.options()], env={"COLUMNS": "200"})
    assert answer.exit_code == 0, answer.output
    return answer.stdout


def test_ctl_replicas_json_parses_as_the_replicas(admin_server: AdminServer) -> None:
    rows = json.loads(run(admin_server, "ctl", "replicas", "--json"))
    assert [ReplicaView.model_validate(r) for r in rows] == [
        ReplicaView(
            id="r-1", model="m1", node="node1", state="ready", port=9001, on="cpu", restarts=0, error=""
        )
    ]


def test_ctl_replicas_shows_a_fetch_in_progress_in_the_state_column(admin_server: AdminServer) -> None:
    replica = admin_server.fleet.replicas["r-1"]
    replica.state = ReplicaPhase.STARTING
    replica.fetching = FetchProgress(done=410 * 10**6, total=10**9, bytes_per_s=950e6)
    assert "fetching 41 % at 950 MB/s" in run(admin_server, "ctl", "replicas")
    (row,) = json.loads(run(admin_server, "ctl", "replicas", "--json"))
    assert (row["state"], row["progress"]) == ("starting", "fetching 41 % at 950 MB/s")
    assert (row["fetched_bytes"], row["fetch_total_bytes"], row["fetch_bytes_per_s"]) == (
        410 * 10**6,
        10**9,
        950e6,
    )


def test_every_listing_prints_json(admin_server: AdminServer) -> None:
    admin = AdminClient(admin_server.url, admin_server.token)
    admin.create_key("app")
    admin.set_setting("knowledge.embedding_model", "minilm")
    listings = {
        ("ctl", "status"): dict,
        ("status",): dict,
        ("ctl", "nodes"): list,
        ("ctl", "models"): list,
        ("ctl", "model", "list"): list,
        ("ctl", "key", "list"): list,
        ("mirror", "list"): list,
        ("ctl", "config", "list"): dict,
        ("ctl", "config", "history"): list,
        ("ctl", "audit"): list,
    }
    for command, kind in listings.items():
        assert isinstance(json.loads(run(admin_server, *command, "--json")), kind), command
    keys = json.loads(run(admin_server, "ctl", "key", "list", "--json"))
    assert KeyView.model_validate(keys[0]).name == "app"
    assert json.loads(run(admin_server, "ctl", "config", "list", "--json")) == {
        "knowledge.embedding_model": "minilm"
    }
    audit = json.loads(run(admin_server, "ctl", "audit", "--json"))
    assert [a["action"] for a in audit] == ["setting.set", "key.create"]


def test_status_json_carries_the_components(admin_server: AdminServer) -> None:
    status = StatusView.model_validate_json(run(admin_server, "status", "--json"))
    assert [(c.name, c.state.value, c.restarts) for c in status.components] == [
        ("reconciler", "running", 0),
        ("load-reader", "restarting", 2),
        ("usage-writer", "failed", 5),
    ]


def test_status_names_failed_and_restarting_components_with_their_last_error(
    admin_server: AdminServer,
) -> None:
    shown = run(admin_server, "ctl", "status")
    assert "component load-reader" in shown and "OSError: connection refused" in shown
    assert "component usage-writer" in shown and "StoreUnavailable: gone" in shown
    assert "2023-11-14 22:13:20 UTC" in shown  # when the load reader failed (FAILED_AT)
    assert "component reconciler" not in shown  # running: nothing to say


def test_a_component_says_how_long_ago_it_failed() -> None:
    failed = ComponentView(
        name="load-reader",
        state=ComponentState.RESTARTING,
        restarts=2,
        last_error="E",
        last_error_at=FAILED_AT,
    )
    assert describe_component(failed, now=FAILED_AT + 12).endswith("12 s ago)")
    assert describe_component(failed, now=FAILED_AT).startswith(
        "RESTARTING after 2 restarts: E (at 2023-11-14"
    )


def test_a_queue_is_told_by_its_largest_flows_and_its_latest_wait() -> None:
    flows = {f"project:acme/ml/p{n}": n for n in range(1, 7)} | {"": 2}
    busy = QueueView(waiting=sum(flows.values()), by_flow=flows, last_wait_s=1.234)
    assert busy.summary() == (
        "23 waiting (project:acme/ml/p6 6, project:acme/ml/p5 5, project:acme/ml/p4 4, "
        "project:acme/ml/p3 3, 3 more), the latest sent on waited 1.23 s"
    )
    assert QueueView(waiting=1, by_flow={"": 1}).summary() == "1 waiting (no key 1)"
    assert QueueView(last_wait_s=0.5).summary() == "none waiting, the latest sent on waited 0.50 s"
