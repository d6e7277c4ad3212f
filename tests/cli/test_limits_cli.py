"""``llmgw ctl limits set|get|list|remove`` through a real admin API."""

from __future__ import annotations

import json

from .conftest import AdminServer
from .test_tenancy_cli import run


def test_limits_are_set_read_listed_and_removed(admin_server: AdminServer) -> None:
    run(admin_server, "ctl", "org", "create", "acme")
    run(admin_server, "ctl", "team", "create", "acme/ml")
    run(
        admin_server,
        *("ctl", "limits", "set", "team:acme/ml", "--rpm", "600", "--per-day", "5000"),
        *("--model", "tiny", "--model", "small"),
    )
    got = json.loads(run(admin_server, "ctl", "limits", "get", "team:acme/ml", "--json"))
    assert [(g["subject"], g["requests_per_minute"], g["tokens_per_day"]) for g in got] == [
        ("team:acme/ml", 600, 5000)
    ]
    assert got[0]["models"] == ["small", "tiny"] and got[0]["concurrent"] is None
    assert "team:acme/ml" in run(admin_server, "ctl", "limits", "list")
    run(admin_server, "ctl", "limits", "remove", "team:acme/ml")
    assert json.loads(run(admin_server, "ctl", "limits", "list", "--json")) == []
    run(admin_server, "ctl", "limits", "get", "team:acme/ml", code=1)


def test_an_owner_of_the_wrong_shape_is_refused(admin_server: AdminServer) -> None:
    run(admin_server, "ctl", "limits", "set", "team:acme", "--rpm", "1", code=1)


def test_a_priority_is_set_shown_and_checked(admin_server: AdminServer) -> None:
    run(admin_server, "ctl", "org", "create", "acme")
    run(admin_server, "ctl", "team", "create", "acme/ml")
    run(admin_server, "ctl", "limits", "set", "team:acme/ml", "--priority", "8")
    got = json.loads(run(admin_server, "ctl", "limits", "get", "team:acme/ml", "--json"))
    assert got[0]["priority"] == 8 and got[0]["requests_per_minute"] is None
    assert "PRIORITY" in run(admin_server, "ctl", "limits", "list")
    run(admin_server, "ctl", "limits", "set", "team:acme/ml", "--priority", "12", code=2)
