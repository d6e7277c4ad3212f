"""The portal's models page and playground as a person uses them, in Debian's headless Chromium (driven
by Playwright with ``executable_path``) against a real control plane whose node serves on the
llama-server stand-in: a model added through the form (an invalid field first, its error shown
beside it), seen ready, scaled, a replica's log followed, a streamed chat in the playground with the
request shown as curl and Python, the conversation going on through the Responses API, the
playground's key revoked on leaving, the model removed. Every page is drawn at 1280 and 390 pixels
wide (screenshots under the test's tmp dir, printed with ``pytest -s``) with no console error but
the invalid definition's 400. A member of one team sees, changes and tries only what that covers;
a preset and a Hugging Face pull are added through the form; an embedding model (the vLLM stand-in)
and a picture model (the ComfyUI stand-in) are tried in the playground.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from playwright.sync_api import Browser, Page

from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.hf_hub_standin import FakeHfHub, small_repo
from llmgw.testing.llama_server_standin import STREAM_CHUNKS, write_launcher
from llmgw.testing.nvidia_smi_standin import H100_80G, RTX_4090, install_fake_nvidia_smi
from llmgw.testing.standin_programs import write_standins

from . import chromium
from .chromium import Console, debian_chromium

pytestmark = pytest.mark.e2e

MODEL = "standin-added"
WIDTHS = (1280, 390)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A control plane with a GPU node (two stand-in cards; llama.cpp, vLLM and ComfyUI as stand-ins)
    and a weights file in its mirror; no model."""
    home = tmp_path_factory.mktemp("portal-models")
    with Cluster(home / "cluster", home / "cache") as running:
        running.start_server()
        running.upload(filename="added.gguf", data=b"GGUF stand-in for the models page\n")
        bin_dir = home / "bin"
        smi = install_fake_nvidia_smi(bin_dir, [H100_80G, RTX_4090])
        launcher = write_launcher(bin_dir / "llama-server")
        programs = write_standins(home / "standins")
        engines = {
            **programs.engine_settings().model_dump(exclude_defaults=True),
            "llamacpp": {"binary": str(launcher)},
            "comfyui": {"python": str(programs.python), "main": str(programs.comfyui_main)},
        }
        running.add_node("gpu1", nvidia_smi=str(smi), engines=engines)
        running.start_agent("gpu1")
        wait_for(lambda: any(n["connected"] for n in running.admin.get("/api/nodes")), 60, "gpu1 connects")
        yield running


@pytest.fixture(scope="module")
def browser(cluster: Cluster) -> Iterator[Browser]:
    with debian_chromium() as launched:
        yield launched


def signed_in(browser: Browser, cluster: Cluster, width: int) -> tuple[Page, Console]:
    return chromium.signed_in(browser, cluster.url, cluster.token, width)


def model_row(page: Page) -> Any:
    return page.locator("section:has(h2:text-is('Models')) tr", has=page.locator(f"td:text-is('{MODEL}')"))


def playground_keys(cluster: Cluster) -> list[dict[str, Any]]:
    return [k for k in cluster.admin.get("/api/keys") if k["name"].startswith("playground ")]


def test_a_model_is_added_scaled_tried_and_removed_in_the_portal(
    browser: Browser, cluster: Cluster, tmp_path: Path
) -> None:
    page, console = signed_in(browser, cluster, 1280)
    page.goto(f"{cluster.url}/#/models")
    blob = page.locator("#add-blob option", has_text="added.gguf")
    blob.wait_for(state="attached")
    page.select_option("#add-blob", blob.get_attribute("value"))
    page.fill("#add-name", MODEL)
    page.fill("#add-ctx", "0")
    page.click("#add-model button[type=submit]")

    # the control plane's validation error, beside the field it names
    error = page.locator(".field[data-field='profile.ctx_size'] .field-error")
    error.wait_for()
    assert "greater than 0" in error.inner_text()
    assert page.locator(".field[data-field='name'] .field-error").is_hidden()
    assert MODEL not in {m["name"] for m in cluster.admin.get("/api/models")}

    page.fill("#add-ctx", "2048")
    page.click("#add-model button[type=submit]")
    page.wait_for_selector(f"#add-model [role=status]:has-text('Model {MODEL} added')")
    assert error.is_hidden()
    model_row(page).locator(".badge.ok:text-is('1 / 1')").wait_for(timeout=60_000)
    added = next(m for m in cluster.admin.get("/api/models") if m["name"] == MODEL)
    assert added["definition"]["profiles"][0]["ctx_size"] == 2048

    # scale to two replicas
    model_row(page).locator("form.scale input").fill("2")
    model_row(page).locator("form.scale button[type=submit]").click()
    model_row(page).locator(".badge.ok:text-is('2 / 2')").wait_for(timeout=60_000)
    replicas = cluster.admin.get(f"/api/models/{MODEL}")["definition"]["replicas"]
    assert (replicas["min"], replicas["max"]) == (2, 2)

    # a replica's log, followed
    page.locator(f"section:has(h2:text-is('Replicas')) tr:has(td:text-is('{MODEL}')) .show-log").first.click()
    page.wait_for_selector(".log-panel h2:has-text('followed')")
    page.wait_for_function(
        "document.getElementById('replica-log').textContent.trim().length > 0", timeout=20_000
    )
    page.screenshot(path=str(tmp_path / "models-1280.png"), full_page=True)

    # the playground: a streamed chat with a key minted for the page
    page.goto(f"{cluster.url}/#/playground")
    page.locator(f"#pg-model option[value='{MODEL}']").wait_for(state="attached")
    page.select_option("#pg-model", MODEL)
    page.fill("#pg-system", "Be brief.")
    page.fill("#pg-prompt", "hello there")
    page.fill("#pg-max-tokens", "64")
    shown = page.locator("#pg-curl").inner_text()
    assert f"{cluster.url}/v1/chat/completions" in shown and '"model": "standin-added"' in shown
    assert '"max_tokens": 64' in shown and "$LLMGW_API_KEY" in shown
    as_python = page.locator("#pg-python").inner_text()
    assert "client.chat.completions.create(" in as_python and "stream=True" in as_python
    page.click("#pg-send")
    answer = page.locator(".turn.assistant[data-done=true] .text")
    answer.wait_for(timeout=30_000)
    assert answer.inner_text().startswith("tok0 tok1") and answer.inner_text().endswith(
        f"tok{STREAM_CHUNKS - 1}"
    )
    minted = playground_keys(cluster)
    assert len(minted) == 1 and minted[0]["revoked_at"] is None and minted[0]["place"] == ""
    secret_shown = page.evaluate("document.body.innerText.includes('sk-')")
    stored = page.evaluate("JSON.stringify({...sessionStorage, ...localStorage})")
    assert not secret_shown and "sk-" not in stored

    # the same conversation goes on through the Responses API, streamed
    page.select_option("#pg-api", "responses")
    page.fill("#pg-prompt", "and again")
    assert f"{cluster.url}/v1/responses" in page.locator("#pg-curl").inner_text()
    assert "client.responses.create(" in page.locator("#pg-python").inner_text()
    page.click("#pg-send")
    page.locator(".turn.assistant[data-done=true]").nth(1).wait_for(timeout=30_000)
    second = page.locator(".turn.assistant .text").nth(1).inner_text()
    assert second == "Hello! How can I help you today?"
    assert len(playground_keys(cluster)) == 1  # one key for the visit
    page.screenshot(path=str(tmp_path / "playground-1280.png"), full_page=True)

    page.goto(f"{cluster.url}/#/models")  # leaving the playground revokes its key
    wait_for(
        lambda: all(k["revoked_at"] for k in playground_keys(cluster)), 10, "the playground's key is revoked"
    )

    narrow, narrow_console = signed_in(browser, cluster, 390)
    for name in ("models", "playground"):
        narrow.goto(f"{cluster.url}/#/{name}")
        narrow.wait_for_selector(
            "#add-blob option:has-text('added.gguf')"
            if name == "models"
            else f"#pg-model option[value='{MODEL}']",
            state="attached",
        )
        narrow.screenshot(path=str(tmp_path / f"{name}-390.png"), full_page=True)
    narrow.close()
    print("\n".join(f"screenshot: {shot}" for shot in sorted(tmp_path.glob("*.png"))))

    # remove it, confirming
    page.once("dialog", lambda dialog: dialog.accept())
    model_row(page).locator("button.remove").click()
    model_row(page).wait_for(state="detached", timeout=20_000)
    assert MODEL not in {m["name"] for m in cluster.admin.get("/api/models")}
    # the one failed load is the invalid definition's answer, which the browser logs itself
    refused = (
        "Failed to load resource: the server responded with a status of 400 (Bad Request)"
        f" ({cluster.url}/api/models)"
    )
    assert console.errors == [refused] and narrow_console.errors == []
    page.close()


def test_a_member_sees_and_changes_only_what_their_role_covers(browser: Browser, cluster: Cluster) -> None:
    admin = cluster.admin
    admin.create_unit("orgs", {"name": "acme"})
    for team, project in (("ml", "chat"), ("web", "shop")):
        admin.create_unit("teams", {"org": "acme", "name": team})
        admin.create_unit("projects", {"org": "acme", "team": team, "name": project})
    sha = cluster.upload(filename="tiny.gguf", data=b"GGUF roles")["sha256"]
    for name, owner in (
        ("open", ""),
        ("chat-only", "project:acme/ml/chat"),
        ("shop-only", "project:acme/web/shop"),
    ):
        admin.add_model({"name": name, "source": {"sha256": sha}, "owner": owner, "replicas": {"min": 0}})
    admin.create_user("mia")
    admin.bind_role("mia", "member", "team:acme/ml")
    token = admin.create_token("mia", "e2e", 3600).token

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    console = Console(page)
    page.goto(f"{cluster.url}/#/models")  # signed in there: the cluster page is a cluster viewer's
    page.fill("#token", token)
    page.click("button[type=submit]")
    page.wait_for_selector("td:text-is('chat-only')")
    rows = page.locator("section:has(h2:text-is('Models')) tbody tr")
    names = {rows.nth(n).locator("td").first.inner_text() for n in range(rows.count())}
    assert names == {"open", "chat-only"}  # the other team's project's model does not exist for mia
    assert page.locator("button.remove[data-model='chat-only']").is_visible()
    assert page.locator("button.remove[data-model='open']").count() == 0  # the cluster's: no role there
    assert "viewer's role at the cluster" in page.locator("section:has(h2:text-is('Replicas'))").inner_text()
    owners = page.locator("#add-owner option").all_inner_texts()
    assert "user:mia" in owners and "project:acme/ml/chat" in owners and "project:acme/web/shop" not in owners
    assert "the cluster (every key)" not in owners

    page.goto(f"{cluster.url}/#/playground")
    page.locator("#pg-place option[value='project:acme/ml/chat']").wait_for(state="attached")
    places = page.locator("#pg-place option").evaluate_all("options => options.map(o => o.value)")
    assert sorted(places) == ["project:acme/ml/chat", "user:mia"]
    page.select_option("#pg-place", "project:acme/ml/chat")
    offered = page.locator("#pg-model option").evaluate_all("options => options.map(o => o.value)")
    assert sorted(offered) == ["chat-only", "open"]
    assert console.errors == []
    page.close()


def test_a_preset_is_added_with_the_mirrored_file_of_its_name(browser: Browser, cluster: Cluster) -> None:
    blob = cluster.upload(filename="SmolLM2-135M-Instruct.Q4_1.gguf", data=b"GGUF stand-in for the preset\n")
    page, console = signed_in(browser, cluster, 1280)
    page.goto(f"{cluster.url}/#/models")
    page.locator("#add-preset option[value='smollm2-135m-instruct']").wait_for(state="attached")
    page.locator("#add-blob option", has_text="SmolLM2").wait_for(state="attached")
    page.select_option("#add-from", "preset")
    assert page.locator("#add-blob").is_hidden() and page.locator("#add-preset").is_visible()
    page.select_option("#add-preset", "smollm2-135m-instruct")
    assert page.input_value("#add-name") == "smollm2-135m-instruct"
    assert page.input_value("#add-memory") == "512"
    page.fill("#add-min", "0")
    page.click("#add-model button[type=submit]")
    page.wait_for_selector("#add-model [role=status]:has-text('Model smollm2-135m-instruct added')")

    added = cluster.admin.get("/api/models/smollm2-135m-instruct")["definition"]
    assert added["source"]["sha256"] == blob["sha256"]
    assert added["source"]["filename"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (added["profiles"][0]["memory_mb"], added["replicas"]["min"]) == (512, 0)
    cluster.admin.request("DELETE", "/api/models/smollm2-135m-instruct")
    assert console.errors == []
    page.close()


def test_a_model_is_pulled_from_hugging_face_and_added_in_the_form(
    browser: Browser, cluster: Cluster
) -> None:
    with FakeHfHub({"org/tiny": small_repo("tiny")}) as hub:
        cluster.admin.set_setting("mirror.hf_endpoint", hub.url)
        page, console = signed_in(browser, cluster, 1280)
        page.goto(f"{cluster.url}/#/models")
        page.select_option("#add-from", "hf")
        page.fill("#add-hf", "hf:org/tiny")
        page.click("#add-pull-start")
        page.wait_for_selector(
            "#add-pull:has-text('pulled hf:org/tiny'), #add-model .problem", timeout=30_000
        )
        assert page.locator("#add-model .problem").count() == 0, page.locator(
            "#add-model .problem"
        ).inner_text()
    assert page.input_value("#add-name") == "tiny"
    page.fill("#add-engine", "vllm")
    page.fill("#add-min", "0")
    page.click("#add-model button[type=submit]")
    page.wait_for_selector("#add-model [role=status]:has-text('Model tiny added')")

    pulled = next(p for p in cluster.admin.get("/api/mirror/pulls") if p["source"].startswith("hf:org/tiny"))
    source = cluster.admin.get("/api/models/tiny")["definition"]["source"]
    assert source["format"] == "safetensors"
    assert (source["sha256"], source["filename"]) == (
        pulled["catalog_source"]["sha256"],
        pulled["catalog_source"]["filename"],
    )
    cluster.admin.request("DELETE", "/api/models/tiny")
    assert console.errors == []
    page.close()


def test_an_embedding_model_is_tried_in_the_playground(browser: Browser, cluster: Cluster) -> None:
    config = cluster.upload(filename="config.json", data=b'{"architectures": ["LlamaForCausalLM"]}')
    source = {"sha256": config["sha256"], "filename": "config.json", "format": "safetensors"}
    profile = {"engine": "vllm", "ctx_size": 4096, "parallel": 2, "serves": "embeddings"}
    cluster.admin.add_model({"name": "embedder", "source": source, "profile": profile})
    cluster.wait_ready("embedder", 120)
    page, console = signed_in(browser, cluster, 1280)
    page.goto(f"{cluster.url}/#/playground")
    page.locator("#pg-model option[value='embedder']").wait_for(state="attached")
    page.select_option("#pg-model", "embedder")
    assert page.locator("#pg-system").is_hidden() and page.locator("#pg-tools").is_hidden()
    page.fill("#pg-prompt", "a sentence to embed")
    assert f"{cluster.url}/v1/embeddings" in page.locator("#pg-curl").inner_text()
    assert "client.embeddings.create(" in page.locator("#pg-python").inner_text()
    page.click("#pg-send")
    said = page.locator(".turn.embedding .text")
    said.wait_for(timeout=30_000)
    expected = client_embedding(cluster, "embedder", "a sentence to embed")
    assert said.inner_text().startswith(f"{len(expected)} dimensions: [{expected[0]:.4f}")
    cluster.admin.request("DELETE", "/api/models/embedder")
    assert console.errors == []
    page.close()


def client_embedding(cluster: Cluster, model: str, text: str) -> list[float]:
    """What the openai SDK gets for ``text``, with a key of the cluster's own."""
    key = cluster.create_key("embedding-check")
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=key, max_retries=0, timeout=30)
    return list(client.embeddings.create(model=model, input=text).data[0].embedding)


PICTURE_WORKFLOW = {
    "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "pictures.safetensors"}},
    "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["1", 1]}},
    "3": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
    "4": {
        "class_type": "KSampler",
        "inputs": {"seed": 0, "steps": 4, "model": ["1", 0], "positive": ["2", 0], "latent_image": ["3", 0]},
    },
    "6": {"class_type": "SaveImage", "inputs": {"filename_prefix": "e2e", "images": ["4", 0]}},
}
PICTURE_INPUTS = {
    "prompt": {"node": "2", "input": "text"},
    "width": {"node": "3", "input": "width"},
    "height": {"node": "3", "input": "height"},
}


def test_a_picture_is_made_in_the_playground_by_a_comfyui_model(browser: Browser, cluster: Cluster) -> None:
    blob = cluster.upload(filename="pictures.safetensors", data=b"pictures" * 8)
    cluster.admin.add_model(
        {
            "name": "pictures",
            "source": {"sha256": blob["sha256"], "filename": "pictures.safetensors", "format": "safetensors"},
            "profile": {"engine": "comfyui", "parallel": 1},
            "comfyui": {"workflow": PICTURE_WORKFLOW, "inputs": PICTURE_INPUTS, "outputs": "image"},
        }
    )
    cluster.wait_ready("pictures", 120)
    page, console = signed_in(browser, cluster, 1280)
    page.goto(f"{cluster.url}/#/playground")
    page.locator("#pg-model option[value='pictures']").wait_for(state="attached")
    page.select_option("#pg-model", "pictures")
    assert page.locator("#pg-size").is_visible() and page.locator("#pg-system").is_hidden()
    page.fill("#pg-prompt", "a red fox")
    page.fill("#pg-size", "128x96")
    assert f"{cluster.url}/v1/images/generations" in page.locator("#pg-curl").inner_text()
    assert "client.images.generate(" in page.locator("#pg-python").inner_text()
    page.click("#pg-send")
    picture = page.locator(".turn.picture[data-done=true] img.picture")
    picture.wait_for(timeout=60_000)
    page.wait_for_function("document.querySelector('img.picture').complete")
    assert picture.evaluate("img => [img.naturalWidth, img.naturalHeight]") == [128, 96]
    cluster.admin.request("DELETE", "/api/models/pictures")
    assert console.errors == []
    page.close()
