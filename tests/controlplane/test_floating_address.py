"""The floating address (C1.9): known cluster-wide, and on the leader only when assigned to its interfaces.

The namespace test runs a child in a network namespace of its own (``unshare
-n``, loopback only) with ``net.ipv4.ip_nonlocal_bind`` set: there a bind to an
address no interface has succeeds, so only the interfaces' addresses
(``ip -j addr show``) tell whether it is held.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from llmgw.controlplane.api.status import address_assigned, assigned_addresses
from llmgw.controlplane.parts import record_vip
from llmgw.core.settingtypes import VIP_SETTING
from llmgw.store.database import Store
from llmgw.testing.admin import TOKEN, admin_api

ADDRESS = "10.77.0.1"

IN_NAMESPACE = f"""
import asyncio, json, socket, subprocess
from llmgw.controlplane.api.status import address_assigned

def sh(*args):
    subprocess.run(args, check=True, capture_output=True)

sh("ip", "link", "set", "lo", "up")
sh("sysctl", "-w", "net.ipv4.ip_nonlocal_bind=1")
seen = {{}}
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
    probe.bind(("{ADDRESS}", 0))  # succeeds although no interface has the address
    seen["bound"] = True
seen["before"] = asyncio.run(address_assigned("{ADDRESS}/24"))
sh("ip", "addr", "add", "{ADDRESS}/32", "dev", "lo")
seen["after"] = asyncio.run(address_assigned("{ADDRESS}/24"))
print(json.dumps(seen))
"""


def in_namespace(script: str) -> dict[str, bool]:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare (util-linux) and ip (iproute2)")
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a network namespace here: {probe.stderr.decode().strip()}")
    done = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(Path(__file__).parents[2] / "src"), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    seen: dict[str, bool] = json.loads(done.stdout)
    return seen


def test_with_nonlocal_bind_only_an_assigned_address_counts_as_held() -> None:
    assert in_namespace(IN_NAMESPACE) == {"bound": True, "before": False, "after": True}


def test_addresses_are_read_from_ip_json() -> None:
    listing = json.dumps(
        [
            {"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
            {"ifname": "eth0", "addr_info": [{"family": "inet6", "local": "fe80::1", "prefixlen": 64}]},
        ]
    )
    assert {str(a) for a in assigned_addresses(listing)} == {"127.0.0.1", "fe80::1"}


async def test_an_address_that_is_no_address_is_not_held() -> None:
    assert not await address_assigned("vip")


async def test_without_ip_nothing_is_taken_as_held() -> None:
    assert not await address_assigned("127.0.0.1", ip="/nonexistent/ip")


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Store]]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    admin = admin_api(store, tmp_path)  # started without --vip
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=admin.app()),
        base_url="http://cp",
        headers={"Authorization": f"Bearer {TOKEN}"},
    ) as client:
        yield client, store
    await store.close()


async def test_a_plane_without_vip_shows_the_clusters_and_whether_the_leader_holds_it(api) -> None:  # type: ignore[no-untyped-def]
    client, store = api
    assert (await client.get("/api/status")).json()["vip"] == ""
    await store.settings.set(VIP_SETTING, "192.0.2.77/32", "cp2")  # TEST-NET-1: on no interface here
    status = (await client.get("/api/status")).json()
    assert (status["vip"], status["vip_on_leader"]) == ("192.0.2.77/32", False)
    await store.settings.set(VIP_SETTING, "127.0.0.1/8", "cp2")
    assert (await client.get("/api/status")).json()["vip_on_leader"] is True


async def test_a_plane_started_with_vip_makes_it_known_cluster_wide(api) -> None:  # type: ignore[no-untyped-def]
    client, store = api
    await record_vip(store, "cp2", "10.0.0.100/24")
    await record_vip(store, "cp3", "")  # a plane without --vip leaves it alone
    assert await store.settings.get(VIP_SETTING) == "10.0.0.100/24"
    assert (await client.get("/api/status")).json()["vip"] == "10.0.0.100/24"
