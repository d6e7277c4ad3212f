"""/api/limits: set, read, list and remove limits, with roles checked against the subject's owner."""

from __future__ import annotations

from .test_tenancy_api import Cluster, cluster  # noqa: F401 - the fixture

CHAT = "project:acme/ml/chat"


async def test_an_admin_sets_reads_lists_and_removes_a_projects_limits(cluster: Cluster) -> None:  # noqa: F811
    admin = cluster.admin
    body = {"requests_per_minute": 60, "tokens_per_day": 1000, "models": ["tiny"]}
    answer = await admin.put(f"/api/limits/{CHAT}", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["subject"] == CHAT and answer.json()["models"] == ["tiny"]
    got = (await admin.get(f"/api/limits/{CHAT}")).json()
    assert (got["requests_per_minute"], got["tokens_per_day"], got["concurrent"]) == (60, 1000, None)
    assert [v["subject"] for v in (await admin.get("/api/limits")).json()] == [CHAT]
    assert (await admin.delete(f"/api/limits/{CHAT}")).status_code == 204
    missing = await admin.get(f"/api/limits/{CHAT}")
    assert missing.status_code == 404 and "llmgw ctl limits list" in missing.json()["error"]["hint"]


async def test_a_negative_limit_or_an_unknown_field_is_refused(cluster: Cluster) -> None:  # noqa: F811
    assert (await cluster.admin.put(f"/api/limits/{CHAT}", json={"concurrent": -1})).status_code == 400
    assert (await cluster.admin.put(f"/api/limits/{CHAT}", json={"rpm": 1})).status_code == 400
    assert (await cluster.admin.put("/api/limits/cluster", json={"concurrent": 1})).status_code == 400


async def test_money_budgets_are_set_and_read_beside_the_token_budgets(cluster: Cluster) -> None:  # noqa: F811
    body = {"tokens_per_day": 1000, "usd_per_day": 2.5, "usd_per_month": 40}
    assert (await cluster.admin.put(f"/api/limits/{CHAT}", json=body)).status_code == 200
    got = (await cluster.admin.get(f"/api/limits/{CHAT}")).json()
    assert (got["tokens_per_day"], got["usd_per_day"], got["usd_per_month"]) == (1000, 2.5, 40.0)


async def test_a_negative_money_budget_is_refused_naming_it(cluster: Cluster) -> None:  # noqa: F811
    answer = await cluster.admin.put(f"/api/limits/{CHAT}", json={"usd_per_day": -1})
    assert answer.status_code == 400
    assert "usd_per_day must be 0 or more" in answer.text


async def test_a_team_admin_limits_its_projects_but_not_its_team(cluster: Cluster) -> None:  # noqa: F811
    async with await cluster.user("tara", ("team-admin", "team:acme/ml")) as tara:
        assert (await tara.put(f"/api/limits/{CHAT}", json={"concurrent": 4})).status_code == 200
        refused = await tara.put("/api/limits/team:acme/ml", json={"concurrent": 4})
        assert refused.status_code == 403 and "manage org:acme" in refused.json()["error"]["message"]
        hidden = await tara.get("/api/limits/project:acme/web/shop")
        assert hidden.status_code == 404


async def test_a_member_limits_a_key_of_its_project_and_sees_only_its_limits(cluster: Cluster) -> None:  # noqa: F811
    await cluster.admin.put("/api/limits/project:acme/web/shop", json={"concurrent": 1})
    async with await cluster.user("mia", ("member", "team:acme/ml")) as mia:
        key = await mia.post("/api/keys", json={"name": "k", "place": CHAT})
        assert key.status_code == 201, key.text
        subject = f"key:{key.json()['id']}"
        assert (await mia.put(f"/api/limits/{subject}", json={"expires_s": 5.0})).status_code == 200
        assert [v["subject"] for v in (await mia.get("/api/limits")).json()] == [subject]


async def test_a_priority_out_of_range_is_refused_saying_its_range(cluster: Cluster) -> None:  # noqa: F811
    answer = await cluster.admin.put(f"/api/limits/{CHAT}", json={"priority": 12})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert "priority must be a whole number from 0" in error["message"] and "0 to 9" in error["hint"]
    assert (await cluster.admin.put(f"/api/limits/{CHAT}", json={"priority": 8})).status_code == 200
    assert (await cluster.admin.get(f"/api/limits/{CHAT}")).json()["priority"] == 8
