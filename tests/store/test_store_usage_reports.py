"""Usage reports: sums per time bucket and group, computed by SQLite and PostgreSQL alike."""

from __future__ import annotations

from datetime import UTC, datetime

from llmgw.store import Store
from llmgw.store.usage import UsageEntry, UsageLog
from llmgw.store.usagereports import Bucket, Dimension, UsageQuery, UsageReports, UsageScope

CHAT = "project:acme/ml/chat"
SEARCH = "project:acme/web/search"
OTHER = "project:beta/ops/batch"
ALICE = "user:alice"


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def entry(
    when: str, key: str = "k1", model: str = "chat", place: str = CHAT, requests: int = 1
) -> UsageEntry:
    return UsageEntry(
        at(when),
        key,
        model,
        requests=requests,
        failed=0,
        prompt_tokens=10 * requests,
        completion_tokens=4 * requests,
        duration_ms=100 * requests,
        place=place,
    )


async def report(store: Store, **query: object) -> list[tuple[object, ...]]:
    result = await UsageReports(store).report(UsageQuery(**query))  # type: ignore[arg-type]
    return [
        (g.start.isoformat(), g.key_id, g.project, g.team, g.org, g.model, g.requests) for g in result.groups
    ]


async def test_hours_split_at_the_hour(store: Store) -> None:
    await UsageLog(store).append(
        [entry("2026-03-01T09:59:59.999"), entry("2026-03-01T10:00:00"), entry("2026-03-01T10:59:00")]
    )
    assert await report(store, bucket=Bucket.HOUR) == [
        ("2026-03-01T09:00:00+00:00", None, None, None, None, "chat", 1),
        ("2026-03-01T10:00:00+00:00", None, None, None, None, "chat", 2),
    ]


async def test_days_split_at_midnight_utc(store: Store) -> None:
    await UsageLog(store).append(
        [
            entry("2026-03-01T23:59:59"),
            entry("2026-03-02T00:00:00"),
            UsageEntry(  # 01:30 in UTC, written with another zone
                datetime.fromisoformat("2026-03-01T20:30:00-05:00"), "k1", "chat", 1, 0, 1, 1, 1, place=CHAT
            ),
        ]
    )
    assert await report(store, bucket=Bucket.DAY) == [
        ("2026-03-01T00:00:00+00:00", None, None, None, None, "chat", 1),
        ("2026-03-02T00:00:00+00:00", None, None, None, None, "chat", 2),
    ]


async def test_months_split_at_the_month_and_the_year(store: Store) -> None:
    await UsageLog(store).append(
        [
            entry("2025-12-31T23:00:00"),
            entry("2026-01-01T00:00:00"),
            entry("2026-01-31T23:59:59"),
            entry("2026-02-01T00:00:01"),
        ]
    )
    assert await report(store, bucket=Bucket.MONTH) == [
        ("2025-12-01T00:00:00+00:00", None, None, None, None, "chat", 1),
        ("2026-01-01T00:00:00+00:00", None, None, None, None, "chat", 2),
        ("2026-02-01T00:00:00+00:00", None, None, None, None, "chat", 1),
    ]


async def test_each_dimension_groups_its_own_rows(store: Store) -> None:
    await UsageLog(store).append(
        [
            entry("2026-03-01T10:00:00", "k1", "chat", CHAT),
            entry("2026-03-01T10:00:01", "k2", "chat", SEARCH, requests=2),
            entry("2026-03-01T10:00:02", "k3", "embed", OTHER, requests=3),
            entry("2026-03-01T10:00:03", "k4", "embed", ALICE, requests=4),
        ]
    )
    day = "2026-03-01T00:00:00+00:00"
    assert await report(store, group_by=(Dimension.ORG,)) == [
        (day, None, None, None, "", None, 4),
        (day, None, None, None, "org:acme", None, 3),
        (day, None, None, None, "org:beta", None, 3),
    ]
    assert await report(store, group_by=(Dimension.TEAM,)) == [
        (day, None, None, "", None, None, 4),
        (day, None, None, "team:acme/ml", None, None, 1),
        (day, None, None, "team:acme/web", None, None, 2),
        (day, None, None, "team:beta/ops", None, None, 3),
    ]
    assert await report(store, group_by=(Dimension.PROJECT,)) == [
        (day, None, CHAT, None, None, None, 1),
        (day, None, SEARCH, None, None, None, 2),
        (day, None, OTHER, None, None, None, 3),
        (day, None, ALICE, None, None, None, 4),
    ]
    assert await report(store, group_by=(Dimension.KEY,)) == [
        (day, key, None, None, None, None, n) for key, n in (("k1", 1), ("k2", 2), ("k3", 3), ("k4", 4))
    ]
    assert await report(store, group_by=(Dimension.ORG, Dimension.MODEL)) == [
        (day, None, None, None, "", "embed", 4),
        (day, None, None, None, "org:acme", "chat", 3),
        (day, None, None, None, "org:beta", "embed", 3),
    ]


async def test_rows_keep_the_place_they_were_written_with(store: Store) -> None:
    await UsageLog(store).append([entry("2026-03-01T10:00:00", "k1", place=CHAT)])
    await UsageLog(store).append([entry("2026-03-01T11:00:00", "k1", place=SEARCH)])  # the key moved
    assert await report(store, group_by=(Dimension.KEY, Dimension.PROJECT)) == [
        ("2026-03-01T00:00:00+00:00", "k1", CHAT, None, None, None, 1),
        ("2026-03-01T00:00:00+00:00", "k1", SEARCH, None, None, None, 1),
    ]


async def test_time_bounds_take_from_inclusive_to_exclusive(store: Store) -> None:
    await UsageLog(store).append(
        [entry("2026-03-01T09:00:00"), entry("2026-03-01T10:00:00"), entry("2026-03-01T11:00:00")]
    )
    rows = await report(
        store, bucket=Bucket.HOUR, since=at("2026-03-01T10:00:00"), until=at("2026-03-01T11:00:00")
    )
    assert rows == [("2026-03-01T10:00:00+00:00", None, None, None, None, "chat", 1)]


async def test_a_scope_reads_its_orgs_teams_and_places_only(store: Store) -> None:
    await UsageLog(store).append(
        [
            entry("2026-03-01T10:00:00", "k1", place=CHAT),
            entry("2026-03-01T10:00:01", "k2", place=SEARCH),
            entry("2026-03-01T10:00:02", "k3", place=OTHER),
            entry("2026-03-01T10:00:03", "k4", place=ALICE),
            entry("2026-03-01T10:00:04", "k5", place=""),
        ]
    )
    keys = (Dimension.KEY,)

    async def seen(scope: UsageScope) -> list[object]:
        return [row[1] for row in await report(store, group_by=keys, scope=scope)]

    assert await seen(UsageScope(orgs=frozenset({"org:acme"}))) == ["k1", "k2"]
    assert await seen(UsageScope(teams=frozenset({"team:beta/ops"}), places=frozenset({ALICE}))) == [
        "k3",
        "k4",
    ]
    assert await seen(UsageScope()) == []
    assert [row[1] for row in await report(store, group_by=keys)] == ["k1", "k2", "k3", "k4", "k5"]


async def test_a_report_past_its_limit_says_it_was_cut(store: Store) -> None:
    await UsageLog(store).append([entry(f"2026-03-01T{hour:02}:00:00") for hour in range(5)])
    result = await UsageReports(store).report(UsageQuery(bucket=Bucket.HOUR, limit=3))
    assert [g.start.hour for g in result.groups] == [0, 1, 2]
    assert result.truncated
    whole = await UsageReports(store).report(UsageQuery(bucket=Bucket.HOUR, limit=5))
    assert len(whole.groups) == 5
    assert not whole.truncated


async def test_timings_give_mean_ttft_and_tokens_per_second_of_timed_rows(store: Store) -> None:
    timed = UsageEntry(
        at("2026-03-01T10:00:00"),
        "k1",
        "chat",
        3,
        1,
        30,
        90,
        900,
        CHAT,
        streamed=2,
        ttft_ms=300,
        generation_ms=1500,
    )
    untimed = entry("2026-03-01T10:10:00")  # written before timings were kept: its tokens have no time
    await UsageLog(store).append([timed, untimed, entry("2026-03-01T10:30:00", model="embed")])
    result = await UsageReports(store).report(UsageQuery(group_by=(Dimension.MODEL,)))
    chat, embed = result.groups
    assert (chat.requests, chat.failed, chat.prompt_tokens, chat.completion_tokens) == (4, 1, 40, 94)
    assert chat.ttft_mean_ms == 150
    assert chat.tokens_per_s == 60
    assert embed.ttft_mean_ms is None
    assert embed.tokens_per_s is None


def refused(when: str, status: int, requests: int = 1, model: str = "chat") -> UsageEntry:
    """Requests of k1 refused with ``status`` before any replica took them."""
    return UsageEntry(at(when), "k1", model, requests, requests, 0, 0, requests, CHAT, refused=status)


async def test_refused_requests_count_in_their_group_and_by_status(store: Store) -> None:
    await UsageLog(store).append(
        [
            entry("2026-03-01T09:00:00", requests=3),
            refused("2026-03-01T09:00:00", 429, 2),
            refused("2026-03-01T09:00:00", 400),
            refused("2026-03-01T09:30:00", 429),
            refused("2026-03-01T09:30:00", 404, model=""),
        ]
    )
    result = await UsageReports(store).report(UsageQuery(bucket=Bucket.HOUR))
    lines = {(g.model, g.requests, g.failed, g.prompt_tokens): g.refused for g in result.groups}
    assert lines == {("", 1, 1, 0): {404: 1}, ("chat", 7, 4, 30): {429: 3, 400: 1}}


async def test_a_cut_report_holds_the_refusals_of_its_own_groups_only(store: Store) -> None:
    await UsageLog(store).append(
        [refused("2026-03-01T09:00:00", 429), refused("2026-03-01T10:00:00", 503, 2, model="other")]
    )
    result = await UsageReports(store).report(UsageQuery(bucket=Bucket.HOUR, limit=1))
    assert result.truncated
    assert [(g.model, g.refused) for g in result.groups] == [("chat", {429: 1})]
