"""Each card's recent readings, kept for the portal's charts, and /api/gpu-history answering them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from llmgw.controlplane.nodes.gpu_history import GpuHistory
from llmgw.core.telemetry import DeviceSample, Telemetry
from llmgw.store.database import Store
from llmgw.testing.admin import TOKEN, admin_api
from llmgw.testing.clock import FakeClock


def sample(at_ms: int, *devices: tuple[int, str, int | None]) -> Telemetry:
    """A sample of the devices (number, class, utilisation) at ``at_ms``."""
    return Telemetry(
        sampled_unix_ms=at_ms,
        samples=tuple(
            DeviceSample(
                device=d, device_class=c, memory_used_mb=100, memory_total_mb=1000, utilization_percent=u
            )
            for d, c, u in devices
        ),
    )


def test_a_card_keeps_its_latest_readings_oldest_first_up_to_the_limit() -> None:
    history = GpuHistory(points_per_card=3)
    for second in range(5):
        history.add("gpu1", sample(second * 1000, (0, "h100-80g", second * 10)))

    [card] = history.cards()
    assert [(p.at_ms, p.utilization_percent) for p in card.points] == [(2000, 20), (3000, 30), (4000, 40)]


def test_a_device_the_node_no_longer_reports_is_dropped_with_its_readings() -> None:
    history = GpuHistory()
    history.add("gpu1", sample(1000, (0, "a100-80g", 5), (1, "a100-80g", 6)))
    history.add("gpu1", sample(2000, (1, "a100-80g", 7)))

    assert [(c.device, len(c.points)) for c in history.cards()] == [(1, 2)]


def test_a_device_whose_class_changed_starts_a_new_history() -> None:
    history = GpuHistory()
    history.add("gpu1", sample(1000, (1000, "a100-80g-mig-3g.40gb", None)))
    history.add("gpu1", sample(2000, (1000, "a100-80g-mig-7g.80gb", None)))

    [card] = history.cards()
    assert (card.label, card.device_class, len(card.points)) == ("0/mig0", "a100-80g-mig-7g.80gb", 1)


def test_a_sample_without_its_time_is_stamped_with_the_wall_clock() -> None:
    clock = FakeClock(wall=1_700_000_000.0)
    history = GpuHistory(wall=clock.time)
    history.add("gpu1", sample(0, (0, "h100-80g", 1)))

    assert next(history.cards()).points[0].at_ms == 1_700_000_000_000


def test_nodes_are_kept_apart_and_listed_by_name() -> None:
    history = GpuHistory()
    history.add("gpu2", sample(1000, (0, "h100-80g", 1)))
    history.add("gpu1", sample(1000, (1, "l4-24g", 2), (0, "l4-24g", 3)))

    assert [(c.node, c.device) for c in history.cards()] == [("gpu1", 0), ("gpu1", 1), ("gpu2", 0)]
    assert [(c.node, c.device) for c in history.cards("gpu2")] == [("gpu2", 0)]


def test_a_history_that_keeps_no_point_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        GpuHistory(points_per_card=0)


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, GpuHistory]]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    history = GpuHistory()
    admin = admin_api(store, tmp_path, gpu_history=history)
    transport = httpx.ASGITransport(app=admin.app())
    async with httpx.AsyncClient(
        transport=transport, base_url="http://cp", headers={"Authorization": f"Bearer {TOKEN}"}
    ) as client:
        yield client, history
    await store.close()


async def test_the_route_answers_each_card_with_its_last_points(api) -> None:  # type: ignore[no-untyped-def]
    client, history = api
    for second in range(3):
        history.add(
            "gpu1", sample(second * 1000, (0, "h100-80g", second), (1000, "a100-80g-mig-3g.40gb", None))
        )
    history.add("gpu2", sample(0, (0, "l4-24g", 50)))

    answer = await client.get("/api/gpu-history", params={"node": "gpu1", "points": 2})

    assert answer.status_code == 200
    assert [(c["label"], c["device_class"], [p["at_ms"] for p in c["points"]]) for c in answer.json()] == [
        ("0", "h100-80g", [1000, 2000]),
        ("0/mig0", "a100-80g-mig-3g.40gb", [1000, 2000]),
    ]
    assert answer.json()[1]["points"][0]["utilization_percent"] is None


async def test_the_route_wants_a_token_and_a_sane_number_of_points(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    assert (await client.get("/api/gpu-history", headers={"Authorization": "Bearer nope"})).status_code == 401
    refused = await client.get("/api/gpu-history", params={"points": 0})
    assert refused.status_code == 400
    assert refused.json()["error"]["message"]
