"""A control plane with two gateway workers sharing its HTTP port: /v1 spread over both, /api passed
on to the control plane, a revoked key refused by both within a second, a killed worker's place
taken by the other until it is started again."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmgw.agent.config import ComfyuiSettings, EngineSettings
from llmgw.controlplane.config import save_server_config
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.llama_server_standin import PROMPT_TOKENS, WHOLE, write_launcher
from llmgw.testing.nvidia_smi_standin import H100_80G, install_fake_nvidia_smi
from llmgw.testing.standin_programs import write_standins
from llmgw.testing.traffic import Traffic

pytestmark = pytest.mark.e2e

MODEL = "standin-chat"
MESHES = "worker-meshes"
MESH_WORKFLOW = {
    "1": {"class_type": "LoadImage", "inputs": {"image": "input.png"}},
    "2": {"class_type": "KSampler", "inputs": {"steps": 60, "latent_image": ["1", 0]}},
    "3": {"class_type": "TripoSRViewer", "inputs": {"mesh": ["2", 0]}},
}
"""60 steps of 0.05 s: three seconds polled through both workers."""
BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("workers")
    running = Cluster(home / "cluster", home / "cache")
    running.config.gateway.workers = 2
    save_server_config(running.config, running.home / "server.yaml")
    with running:
        running.start_server()
        running.add_standin_model(MODEL)
        blob = running.upload(filename="mesh.safetensors", data=b"mesh weights " * 8)
        running.admin.request(
            "POST",
            "/api/models",
            {
                "name": MESHES,
                "source": {"sha256": blob["sha256"], "filename": "mesh.safetensors", "format": "safetensors"},
                "profile": {"engine": "comfyui", "parallel": 1, "gpu_class": "h100-80g"},
                "comfyui": {"workflow": MESH_WORKFLOW, "inputs": {"image": {"node": "1", "input": "image"}},
                            "outputs": "mesh", "licence": "MIT (TripoSR)"},
            },
        )  # fmt: skip
        running.create_key("tests")
        launcher = write_launcher(home / "bin" / "llama-server")
        running.add_node("node1", engines={"llamacpp": {"binary": str(launcher)}})
        programs = write_standins(home / "standins")
        running.add_node(
            "gpu1",
            nvidia_smi=str(install_fake_nvidia_smi(home / "smi", [H100_80G])),
            engines=EngineSettings(
                comfyui=ComfyuiSettings(python=str(programs.python), main=str(programs.comfyui_main))
            ),
        )
        running.start_agent("node1")  # first: the chat model goes where its stand-in is
        running.wait_ready(MODEL, 60)
        running.start_agent("gpu1")
        running.wait_ready(MESHES, 120)
        yield running


def chat(cluster: Cluster, key: str) -> tuple[int, int]:
    """One request on a connection of its own: its status and the pid of the worker that answered (0: the
    control plane itself, to which a worker without a full copy yet hands /v1)."""
    request = urllib.request.Request(
        f"{cluster.url}/v1/chat/completions",
        data=BODY,
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, int(answer.headers.get("x-llmgw-worker") or 0)
    except urllib.error.HTTPError as error:
        return error.code, int(error.headers.get("x-llmgw-worker") or 0)


def worker_pids(cluster: Cluster) -> set[int]:
    """The pids of the control plane's ``llmgw server worker`` children."""
    parent = cluster.processes["server"].pid
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and b"worker" in argv:
            found.add(int(entry))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` is still there: gone once its control plane reaped it (every thread exited, so
    its listening socket is closed)."""
    return os.path.exists(f"/proc/{pid}")


def answered_by_both(cluster: Cluster, key: str) -> set[int]:
    """The workers that answered (200) requests, up to both of them (at most 200 requests)."""
    seen = set()
    for _ in range(200):
        status, pid = chat(cluster, key)
        assert status == 200, status
        if pid:
            seen.add(pid)
        if len(seen) == 2:
            break
    return seen


def requests_counted(cluster: Cluster) -> float:
    """llmgw_gateway_requests_total summed over its labels, as the port's /metrics shows it."""
    text = cluster.metrics()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "llmgw_gateway_requests_total"
    )


def test_v1_is_spread_over_both_workers_and_api_reaches_the_control_plane(cluster: Cluster) -> None:
    pids = wait_for(lambda: len(worker_pids(cluster)) == 2 and worker_pids(cluster), 30, "two workers run")
    counted = requests_counted(cluster)
    assert answered_by_both(cluster, cluster.key) == pids
    answers = [chat(cluster, cluster.key) for _ in range(20)]
    assert all(status == 200 and pid in pids for status, pid in answers)  # no /v1 left to the control plane
    # the workers' requests are counted in the port's /metrics, which the control plane serves
    wait_for(lambda: requests_counted(cluster) >= counted + 22, 10, "/metrics counts the workers' requests")
    assert cluster.processes["server"].pid not in pids
    # everything but /v1 is the control plane's, whichever worker took the connection
    for _ in range(10):
        assert any(m["name"] == MODEL for m in cluster.admin.get("/api/models"))


def file_call(
    cluster: Cluster, path: str, data: bytes | None = None, method: str | None = None
) -> tuple[int, bytes, int]:
    """One /v1/files call on a connection of its own: status, body, the pid of the worker that answered."""
    headers = {"authorization": f"Bearer {cluster.key}"}
    if data is not None:
        boundary = "llmgw-files-test"
        headers["content-type"] = f"multipart/form-data; boundary={boundary}"
        data = (
            (
                f'--{boundary}\r\ncontent-disposition: form-data; name="purpose"\r\n\r\nuser_data\r\n'
                f'--{boundary}\r\ncontent-disposition: form-data; name="file"; filename="notes.txt"\r\n'
                "content-type: text/plain\r\n\r\n"
            ).encode()
            + data
            + f"\r\n--{boundary}--\r\n".encode()
        )
    request = urllib.request.Request(f"{cluster.url}{path}", data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read(), int(answer.headers.get("x-llmgw-worker") or 0)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), int(error.headers.get("x-llmgw-worker") or 0)


def test_a_file_uploaded_through_one_worker_is_read_and_deleted_through_either(cluster: Cluster) -> None:
    pids = wait_for(lambda: len(worker_pids(cluster)) == 2 and worker_pids(cluster), 30, "two workers run")
    status, body, uploaded_by = file_call(cluster, "/v1/files", b"kept for any worker")
    assert status == 200, body
    assert "id" in json.loads(body), body
    file_id = json.loads(body)["id"]
    read_by = set()
    for _ in range(200):  # fresh connections until both workers answered
        status, body, pid = file_call(cluster, f"/v1/files/{file_id}/content")
        assert (status, body) == (200, b"kept for any worker")
        read_by.add(pid)
        if read_by >= pids:
            break
    assert read_by >= pids and uploaded_by in pids
    status, body, _ = file_call(cluster, f"/v1/files/{file_id}", method="DELETE")
    assert status == 200 and json.loads(body)["deleted"]
    for _ in range(10):
        assert file_call(cluster, f"/v1/files/{file_id}")[0] == 404


def responses_call(cluster: Cluster, body: dict[str, Any]) -> tuple[int, dict[str, Any], int]:
    """One /v1/responses call on a connection of its own: status, answer, the worker that answered."""
    request = urllib.request.Request(
        f"{cluster.url}/v1/responses",
        data=json.dumps(body).encode(),
        headers={"authorization": f"Bearer {cluster.key}", "content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read()), int(answer.headers.get("x-llmgw-worker") or 0)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), int(error.headers.get("x-llmgw-worker") or 0)


def test_a_responses_follow_up_on_another_worker_continues_the_first(cluster: Cluster) -> None:
    pids = wait_for(lambda: len(worker_pids(cluster)) == 2 and worker_pids(cluster), 30, "two workers run")
    status, first, by = responses_call(cluster, {"model": MODEL, "input": "My name is Ada."})
    assert status == 200, first
    for _ in range(200):  # fresh connections until the other worker takes the follow-up
        status, follow_up, other = responses_call(
            cluster, {"model": MODEL, "input": "What is my name?", "previous_response_id": first["id"]}
        )
        assert status == 200, follow_up
        if other != by:
            break
    assert other != by and {by, other} <= pids, "the follow-up was answered by the other worker"
    assert follow_up["output"][0]["content"][0]["text"]


def job_call(cluster: Cluster, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any], int]:
    """One /v1/jobs call on a connection of its own: status, answer, the worker that answered."""
    request = urllib.request.Request(
        f"{cluster.url}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"authorization": f"Bearer {cluster.key}", "content-type": "application/json"},
        method=method,
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read()), int(answer.headers.get("x-llmgw-worker") or 0)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), int(error.headers.get("x-llmgw-worker") or 0)


def test_a_job_taken_by_one_worker_is_polled_through_both_until_it_is_done(cluster: Cluster) -> None:
    pids = wait_for(lambda: len(worker_pids(cluster)) == 2 and worker_pids(cluster), 30, "two workers run")
    status, created, _ = job_call(
        cluster, "POST", "/v1/jobs", {"model": MESHES, "inputs": {"image": "fox.png"}}
    )
    assert status == 202, created
    polled_by: dict[int, set[str]] = {}

    def done() -> dict[str, Any] | None:
        status, job, pid = job_call(cluster, "GET", f"/v1/jobs/{created['id']}")
        assert status == 200, job
        polled_by.setdefault(pid, set()).add(job["state"])
        return job if job["state"] == "done" else None

    finished = wait_for(done, 60, "the job is done", 0.05)
    assert set(polled_by) == pids, f"both workers answered the polls: {polled_by}"
    assert all("running" in states for states in polled_by.values()), f"each saw it running: {polled_by}"
    (made,) = finished["files"]
    for _ in range(10):  # its file, through whichever worker
        request = urllib.request.Request(
            "http://" + made["url"].split("://", 1)[1], headers={"authorization": f"Bearer {cluster.key}"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.read()[:4] == b"glTF"


def test_usage_summed_in_each_worker_is_stored_exactly_as_one_process_stores_it(cluster: Cluster) -> None:
    """Each worker sums its usage per key, model and place and sends the sums with its channel's tick;
    every request, token and error counts once, whichever process answered."""
    pids = wait_for(lambda: len(worker_pids(cluster)) == 2 and worker_pids(cluster), 30, "two workers run")
    made = cluster.admin.request("POST", "/api/keys", {"name": "usage-through-workers"})
    key_id, key = made["id"], made["key"]
    answers = [chat(cluster, key) for _ in range(60)]
    assert all(status == 200 for status, _ in answers)
    assert {pid for _, pid in answers} == pids  # both workers answered some
    completion = json.loads(WHOLE)["usage"]["completion_tokens"]

    def counted() -> dict[str, Any] | None:
        answer = cluster.admin.request("GET", "/api/usage?group_by=key&group_by=model&by=day")
        lines = [line for line in answer["lines"] if line["key"] == key_id]
        return lines[0] if lines and lines[0]["requests"] >= 60 else None

    line = wait_for(counted, 30, "the 60 requests are in /api/usage")
    assert (line["model"], line["requests"], line["errors"]) == (MODEL, 60, 0)
    assert (line["prompt_tokens"], line["completion_tokens"]) == (60 * PROMPT_TOKENS, 60 * completion)


def test_a_revoked_key_is_refused_by_every_worker_within_a_second(cluster: Cluster) -> None:
    key = str(cluster.admin.request("POST", "/api/keys", {"name": "to-revoke"})["key"])
    answered_by_both(cluster, key)
    cluster.admin.request("DELETE", "/api/keys/to-revoke")
    revoked = time.monotonic()

    def refused_by_both() -> bool:
        statuses: dict[int, set[int]] = {}
        for _ in range(40):
            status, pid = chat(cluster, key)
            statuses.setdefault(pid, set()).add(status)
        return len(statuses) == 2 and all(seen == {401} for seen in statuses.values())

    wait_for(refused_by_both, 1.0, "both workers refuse the revoked key", interval_s=0.05)
    assert time.monotonic() - revoked < 1.5  # the last round of 40 requests included


def test_a_killed_worker_leaves_v1_answering_and_is_started_again(cluster: Cluster) -> None:
    pids = wait_for(lambda: len(worker_pids(cluster)) == 2 and worker_pids(cluster), 30, "two workers run")
    victim = min(pids)
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: not alive(victim), 10, "the killed worker's sockets are closed")
    for _ in range(50):  # the kernel gives new connections to the other worker at once
        status, pid = chat(cluster, cluster.key)
        assert status == 200 and pid != victim
    again = wait_for(
        lambda: (
            len(worker_pids(cluster)) == 2 and victim not in worker_pids(cluster) and worker_pids(cluster)
        ),
        30,
        "the killed worker is started again",
    )
    wait_for(lambda: answered_by_both(cluster, cluster.key) == again, 30, "both workers answer again")


def instance(cluster: Cluster) -> str:
    with urllib.request.urlopen(f"{cluster.url}/healthz", timeout=5) as answer:
        return str(json.load(answer)["instance"])


def test_a_restart_of_the_control_plane_keeps_the_port_served_and_fails_no_request(cluster: Cluster) -> None:
    """The workers keep answering /v1 while their control plane starts again; the next start starts
    its own and stops the old ones once they serve."""
    old = wait_for(lambda: len(worker_pids(cluster)) == 2 and worker_pids(cluster), 30, "two workers run")
    before = instance(cluster)
    traffic = Traffic(cluster.url, cluster.key, MODEL, pause_s=0.02, timeout_s=60).start()
    try:
        wait_for(lambda: len(traffic.outcomes) >= 10, 30, "traffic flows")
        cluster.admin.request("POST", "/api/control-plane/restart", {"reason": "test"})
        wait_for(lambda: instance(cluster) != before, 60, "the control plane starts again")
        new = wait_for(
            lambda: len(pids := worker_pids(cluster)) == 2 and not pids & old and pids, 60, "new workers"
        )
        wait_for(lambda: not any(alive(pid) for pid in old), 30, "the old workers stopped")
        count = len(traffic.outcomes)
        wait_for(lambda: len(traffic.outcomes) >= count + 20, 60, "traffic goes on")
    finally:
        outcomes = traffic.stop()
    failed = [o for o in outcomes if not o.ok]
    assert failed == [], f"{len(failed)} of {len(outcomes)} failed: {failed[:3]}\n{cluster.tails()}"
    assert answered_by_both(cluster, cluster.key) == new
