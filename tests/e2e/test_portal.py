"""The portal in a real browser: Debian's headless Chromium, driven by Playwright's Python API (with
``executable_path``: no browser of Playwright's own), against a real control plane with a GPU node
(the nvidia-smi stand-in, its readings changed between samples) that serves a model on the
llama-server stand-in. Every page is drawn at 1280 and 390 pixels wide without a console error,
and a key created on the keys page is in /api/keys afterwards.

The screenshots are saved under the test's tmp dir; their paths are printed (``pytest -s``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import pytest
from playwright.sync_api import Browser, Page

from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.llama_server_standin import write_launcher
from llmgw.testing.nvidia_smi_standin import A100_80G_MIG, H100_80G, RTX_4090, install_fake_nvidia_smi

from . import chromium
from .chromium import Console, debian_chromium

pytestmark = pytest.mark.e2e

MODEL = "standin-portal"
WIDTHS = (1280, 390)
PAGES = {
    "cluster": ("#/cluster", "#serving-toggle"),
    "nodes": ("#/nodes", "a[href='#/nodes/gpu1']"),
    "node": ("#/nodes/gpu1", "article.card[data-device='0'] path.line"),
    "gpus": ("#/gpus", ".gpu.level-high"),
    "models": ("#/models", "text=standin-portal"),
    "keys": ("#/keys", "#usage-period"),
    "settings": ("#/settings", "#set-setting"),
    "batches": ("#/batches", "td:has-text('3 / 3')"),
}
"""Each page: its address, and what shows once it has drawn what the cluster holds."""


def cards(utilisation: int) -> list[Any]:
    """The node's cards, the H100 at ``utilisation`` (its readings change between samples)."""
    return [
        replace(
            H100_80G,
            utilization_percent=utilisation,
            temperature_c=40 + utilisation // 4,
            power_draw_w=90.0 + 5 * utilisation,
        ),
        A100_80G_MIG,
        replace(RTX_4090, utilization_percent=utilisation // 3),
    ]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("portal")
    with Cluster(home / "cluster", home / "cache") as running:
        running.start_server()
        weights = home / "weights.gguf"
        weights.write_bytes(b"GGUF stand-in for the portal\n")
        running.add_model(MODEL, weights)
        bin_dir = home / "bin"
        smi = install_fake_nvidia_smi(bin_dir, cards(20))
        launcher = write_launcher(bin_dir / "llama-server")
        running.add_node("gpu1", nvidia_smi=str(smi), engines={"llamacpp": {"binary": str(launcher)}})
        running.start_agent("gpu1")
        running.wait_ready(MODEL, 60)
        running.create_key("portal-traffic")
        running.admin.set_setting(f"pricing.models.{MODEL}", {"input": 1000.0, "output": 2000.0})
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key=running.key, max_retries=0, timeout=30)
        for _ in range(3):
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        lines = [
            json.dumps({"custom_id": f"r{n}", "method": "POST", "url": "/v1/chat/completions", "body": {
                "model": MODEL, "messages": [{"role": "user", "content": "hi"}]}})
            for n in range(3)
        ]  # fmt: skip
        made = client.files.create(file=("in.jsonl", "\n".join(lines).encode()), purpose="batch")
        batch = client.batches.create(
            input_file_id=made.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        wait_for(lambda: client.batches.retrieve(batch.id).status == "completed", 30, "the batch completes")
        for seen, utilisation in ((1, 65), (2, 95)):  # three readings, 10 s apart, for the charts
            wait_for(lambda seen=seen: readings(running) >= seen, 30, f"{seen} telemetry sample(s) of gpu1")
            install_fake_nvidia_smi(bin_dir, cards(utilisation))
        wait_for(lambda: readings(running) >= 3, 30, "three telemetry samples of gpu1")
        yield running


def readings(cluster: Cluster) -> int:
    history = cluster.admin.get("/api/gpu-history?node=gpu1")
    return min((len(card["points"]) for card in history), default=0)


@pytest.fixture(scope="module")
def browser(cluster: Cluster) -> Iterator[Browser]:
    """Chromium, started after the cluster: Playwright's sync API holds an event loop in this thread,
    and the cluster's setup runs one of its own."""
    with debian_chromium() as launched:
        yield launched


def signed_in(browser: Browser, cluster: Cluster, width: int) -> tuple[Page, Console]:
    return chromium.signed_in(browser, cluster.url, cluster.token, width)


@pytest.mark.parametrize("width", WIDTHS)
def test_every_page_draws_the_cluster_without_a_console_error(
    browser: Browser, cluster: Cluster, tmp_path: Path, width: int
) -> None:
    page, console = signed_in(browser, cluster, width)
    shots = []
    for name, (address, drawn) in PAGES.items():
        page.goto(f"{cluster.url}/{address}")
        page.wait_for_selector(drawn, timeout=20_000)
        # the page reads /api/events as a stream that stays open: "live" once its first events came
        page.wait_for_function("document.getElementById('live-state')?.textContent === 'live'")
        shot = tmp_path / f"{name}-{width}.png"
        page.screenshot(path=str(shot), full_page=True)
        shots.append(shot)
    print("\n".join(f"screenshot: {shot}" for shot in shots))
    assert console.errors == []
    page.close()


def test_a_key_created_on_the_keys_page_is_in_the_api(browser: Browser, cluster: Cluster) -> None:
    page, console = signed_in(browser, cluster, 1280)
    page.goto(f"{cluster.url}/#/keys")
    page.fill("#key-name", "made-in-the-portal")
    page.click("#create-key button[type=submit]")
    secret = page.wait_for_selector("#new-key").inner_text()

    keys = {key["name"]: key for key in cluster.admin.get("/api/keys")}
    assert "made-in-the-portal" in keys
    assert keys["made-in-the-portal"]["prefix"] in secret  # the secret shown once is that key's
    page.wait_for_selector("td:has-text('made-in-the-portal')")
    assert console.errors == []
    page.close()


def test_the_keys_page_shows_what_the_priced_requests_cost(browser: Browser, cluster: Cluster) -> None:
    page, console = signed_in(browser, cluster, 1280)
    page.goto(f"{cluster.url}/#/keys")
    spent = page.locator("#usage-spend")
    spent.wait_for(timeout=30_000)
    said = spent.inner_text()
    amount = float(said.split(":")[1].split()[0])
    usage = cluster.admin.get("/api/usage")  # read after the page: the batch's requests may still add
    total = sum(line["cost"] for line in usage["lines"])
    assert said.endswith(" USD") and 0 < amount <= round(total, 4) + 0.005, (said, total)
    assert "Cost (USD)" in page.locator("table").last.inner_text()
    assert console.errors == []
    page.close()


def test_a_wrong_token_is_refused_on_the_sign_in_page_with_what_to_do(
    browser: Browser, cluster: Cluster
) -> None:
    page = browser.new_page()
    page.goto(f"{cluster.url}/")
    page.fill("#token", "not-the-token")
    page.click("button[type=submit]")

    said = page.wait_for_selector("[role=alert]").inner_text()
    assert "token" in said and "admin.token" in said
    page.close()
