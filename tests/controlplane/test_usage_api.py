"""/api/usage: each caller sees the usage of what they may read, summed per bucket and group, in JSON
or CSV, cut at a limit that the answer admits — over ASGI with a real SQLite store."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime

import httpx

from llmgw.store.usage import UsageEntry, UsageLog

from .test_tenancy_api import Cluster
from .test_tenancy_api import cluster as cluster  # the fixture, shared

CHAT = "project:acme/ml/chat"
SHOP = "project:acme/web/shop"
MORNING = datetime(2026, 3, 1, 9, 30, tzinfo=UTC)
NOON = datetime(2026, 3, 1, 12, 5, tzinfo=UTC)


async def used(cluster: Cluster) -> str:
    """Usage of a chat key (made through /api), a shop key, Ann's own key and a key of no place."""
    created = await cluster.admin.post("/api/keys", json={"name": "chat-ci", "place": CHAT})
    chat_key = str(created.json()["id"])
    timed = {"streamed": 2, "ttft_ms": 250, "generation_ms": 2000}
    await UsageLog(cluster.store).append(
        [
            UsageEntry(
                MORNING, chat_key, "llama", 2, 1, 20, 40, 900, CHAT, **timed, cached_tokens=5, cost=0.25
            ),
            UsageEntry(MORNING, "k-shop", "llama", 3, 0, 30, 30, 900, SHOP, cost=0.5),
            UsageEntry(NOON, "k-ann", "embed", 4, 0, 40, 0, 900, "user:ann"),
            UsageEntry(NOON, "k-none", "llama", 5, 0, 50, 10, 900, ""),
        ]
    )
    return chat_key


async def projects_seen(client: httpx.AsyncClient) -> list[str]:
    answer = await client.get("/api/usage", params={"group_by": "project"})
    assert answer.status_code == 200, answer.text
    return [line["project"] for line in answer.json()["lines"]]


async def test_a_cluster_admin_sees_all_usage(cluster: Cluster) -> None:
    await used(cluster)
    assert sorted(await projects_seen(cluster.admin)) == ["", CHAT, SHOP, "user:ann"]


async def test_org_and_team_roles_see_their_own_projects_and_a_user_their_own_keys(cluster: Cluster) -> None:
    await used(cluster)
    async with await cluster.user("olga", ("org-admin", "org:acme")) as olga:
        assert sorted(await projects_seen(olga)) == [CHAT, SHOP]
    async with await cluster.user("mia", ("member", "team:acme/ml")) as mia:
        assert await projects_seen(mia) == [CHAT]
    async with await cluster.user("wes", ("viewer", "team:acme/web")) as wes:
        assert await projects_seen(wes) == [SHOP]
    async with await cluster.user("ann") as ann:
        assert await projects_seen(ann) == ["user:ann"]


async def test_lines_hold_tokens_errors_ttft_and_tokens_per_second_per_model(cluster: Cluster) -> None:
    chat_key = await used(cluster)
    answer = await cluster.admin.get("/api/usage", params=[("group_by", "key"), ("group_by", "model")])
    body = answer.json()
    assert (body["by"], body["group_by"], body["truncated"], body["note"]) == (
        "day",
        ["key", "model"],
        False,
        "",
    )
    chat = next(line for line in body["lines"] if line["key"] == chat_key)
    assert chat == {
        "start": "2026-03-01T00:00:00Z",
        "key": chat_key,
        "key_name": "chat-ci",
        "project": None,
        "team": None,
        "org": None,
        "model": "llama",
        "requests": 2,
        "errors": 1,
        "prompt_tokens": 20,
        "completion_tokens": 40,
        "cached_tokens": 5,
        "cost": 0.25,
        "refused": {},
        "ttft_mean_ms": 125.0,
        "tokens_per_s": 20.0,
    }


async def test_hours_and_time_bounds_pick_the_buckets(cluster: Cluster) -> None:
    await used(cluster)
    answer = await cluster.admin.get(
        "/api/usage", params={"by": "hour", "from": "2026-03-01T10:00:00", "to": "2026-03-01T13:00:00+00:00"}
    )
    body = answer.json()
    assert [(line["start"], line["model"], line["requests"]) for line in body["lines"]] == [
        ("2026-03-01T12:00:00Z", "embed", 4),
        ("2026-03-01T12:00:00Z", "llama", 5),
    ]
    assert (body["from"], body["to"]) == ("2026-03-01T10:00:00Z", "2026-03-01T13:00:00Z")


async def test_a_to_not_after_from_is_refused_naming_it(cluster: Cluster) -> None:
    answer = await cluster.admin.get("/api/usage", params={"from": "2026-03-02", "to": "2026-03-01"})
    assert answer.status_code == 400
    assert answer.json()["error"]["problems"] == [{"field": "to", "problem": "must be later than from"}]


async def test_csv_has_a_header_and_the_grouped_columns_only(cluster: Cluster) -> None:
    await used(cluster)
    answer = await cluster.admin.get("/api/usage", params={"group_by": "org", "format": "csv"})
    assert answer.headers["content-type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(answer.text)))
    assert rows == [
        [
            "start",
            "org",
            "requests",
            "errors",
            "prompt_tokens",
            "completion_tokens",
            "cached_tokens",
            "cost",
            "refused",
            "ttft_mean_ms",
            "tokens_per_s",
        ],
        ["2026-03-01T00:00:00Z", "", "9", "0", "90", "10", "0", "0.0", "", "", ""],
        ["2026-03-01T00:00:00Z", "org:acme", "5", "1", "50", "70", "5", "0.75", "", "125.0", "20.0"],
    ]


async def test_accepting_csv_answers_csv(cluster: Cluster) -> None:
    await used(cluster)
    answer = await cluster.admin.get("/api/usage", headers={"Accept": "text/csv"})
    assert answer.text.splitlines()[0].startswith("start,model,requests,")


async def test_an_answer_past_its_limit_says_so_in_json_and_csv(cluster: Cluster) -> None:
    await used(cluster)
    body = (await cluster.admin.get("/api/usage", params={"group_by": "project", "limit": 2})).json()
    assert len(body["lines"]) == 2 and body["truncated"]
    assert "more than 2 lines matched" in body["note"]
    cut = await cluster.admin.get("/api/usage", params={"group_by": "project", "limit": 2, "format": "csv"})
    assert cut.headers["x-llmgw-truncated"] == "true"
    whole = await cluster.admin.get("/api/usage", params={"group_by": "project", "format": "csv"})
    assert "x-llmgw-truncated" not in whole.headers


async def test_the_openapi_describes_usage_in_json_and_csv(cluster: Cluster) -> None:
    schema = (await cluster.admin.get("/api/openapi.json")).json()
    answers = schema["paths"]["/api/usage"]["get"]["responses"]["200"]["content"]
    assert set(answers) == {"application/json", "text/csv"}
    assert "UsageAnswer" in schema["components"]["schemas"]


async def test_refused_requests_show_by_status_beside_the_tokens_in_json_and_csv(cluster: Cluster) -> None:
    await UsageLog(cluster.store).append(
        [
            UsageEntry(MORNING, "k-shop", "llama", 3, 0, 30, 30, 900, SHOP),
            UsageEntry(MORNING, "k-shop", "llama", 2, 2, 0, 0, 2, SHOP, refused=429),
            UsageEntry(NOON, "k-shop", "llama", 1, 1, 0, 0, 1, SHOP, refused=400),
        ]
    )
    body = (await cluster.admin.get("/api/usage")).json()
    (line,) = body["lines"]
    assert (line["requests"], line["errors"], line["prompt_tokens"]) == (6, 3, 30)
    assert line["refused"] == {"400": 1, "429": 2}
    rows = list(
        csv.DictReader(io.StringIO((await cluster.admin.get("/api/usage", params={"format": "csv"})).text))
    )
    assert [row["refused"] for row in rows] == ["400:1 429:2"]


async def test_lines_hold_their_cost_in_the_currency_and_the_answer_its_totals(cluster: Cluster) -> None:
    await used(cluster)
    await cluster.store.settings.set("pricing.currency", "EUR", "test")
    body = (await cluster.admin.get("/api/usage", params={"group_by": "project"})).json()
    assert body["currency"] == "EUR"
    assert {line["project"]: line["cost"] for line in body["lines"]} == {
        "": 0.0,
        CHAT: 0.25,
        SHOP: 0.5,
        "user:ann": 0.0,
    }
    assert body["totals"] == {
        "requests": 14,
        "errors": 1,
        "prompt_tokens": 140,
        "completion_tokens": 80,
        "cached_tokens": 5,
        "cost": 0.75,
    }


async def test_the_currency_is_usd_until_one_is_set(cluster: Cluster) -> None:
    await used(cluster)
    assert (await cluster.admin.get("/api/usage")).json()["currency"] == "USD"
