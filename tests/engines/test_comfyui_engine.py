"""ComfyUI as an engine: the gate's command line, the base directory it prepares, its metrics."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from llmgw.core.engines import COMFYUI, find_engine
from llmgw.core.validation import check_args
from llmgw.engines import comfyui
from llmgw.engines.comfyui_files import WEIGHT_KINDS, link_hf_repo, parse_pairs, prepare_base, weight_links
from llmgw.engines.engine import Launch, parse_load
from llmgw.engines.registry import engine_named
from llmgw.errors import ConfigError
from llmgw.testing.cluster import free_port
from llmgw.testing.eventually import eventually_sync
from llmgw.testing.standin_programs import write_standins


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_row_and_the_engine_object_are_registered() -> None:
    assert find_engine("comfyui") is COMFYUI
    assert engine_named("comfyui") is comfyui.ENGINE
    assert comfyui.ENGINE.capabilities is COMFYUI


def test_the_agent_starts_the_gate_with_the_replicas_port_key_file_and_weights(tmp_path: Path) -> None:
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "flux1-schnell.safetensors").write_bytes(b"w")
    (weights / "ae.safetensors").write_bytes(b"v")
    key_file = tmp_path / "shard" / "api-key"
    launch = Launch(
        weights=weights, port=21001, api_key="sk-replica", model="flux-schnell", host="10.0.0.5",
        key_file=key_file, entry=Path("/opt/ComfyUI/main.py"), args=("--cpu",),
    )  # fmt: skip
    argv = comfyui.ENGINE.command_line(Path("/opt/comfy/bin/python"), launch)
    assert argv[1:4] == ["-m", "llmgw.cli.main", "comfyui-gate"]
    assert flag(argv, "--port") == "21001" and flag(argv, "--host") == "10.0.0.5"
    assert flag(argv, "--key-file") == str(key_file)
    assert flag(argv, "--base-dir") == str(tmp_path / "shard" / "comfyui")
    assert flag(argv, "--comfyui-python") == "/opt/comfy/bin/python"
    assert flag(argv, "--comfyui-main") == "/opt/ComfyUI/main.py"
    given = [argv[i + 1] for i, word in enumerate(argv) if word == "--weights"]
    assert given == [f"ae.safetensors={weights / 'ae.safetensors'}",
                     f"flux1-schnell.safetensors={weights / 'flux1-schnell.safetensors'}"]  # fmt: skip
    assert argv[argv.index("--") + 1 :] == ["--cpu"]  # the profile's args go on to ComfyUI
    assert "sk-replica" not in " ".join(argv)


def test_without_comfyuis_main_the_gate_is_not_started() -> None:
    launch = Launch(weights=Path("w"), port=1, api_key="k", model="m", key_file=Path("/s/api-key"))
    with pytest.raises(ConfigError, match=r"engines\.comfyui\.main"):
        comfyui.ENGINE.command_line(Path("python"), launch)


@pytest.mark.parametrize(
    "given", ["--listen", "--base-directory", "--port", "--key-file", "--output-directory"]
)
def test_a_profile_may_not_set_the_flags_the_gate_sets(given: str) -> None:
    assert check_args("comfyui", [given, "x"])


def test_the_minimal_metrics_read_as_running_and_waiting() -> None:
    load = parse_load("comfyui_queue_running 1\ncomfyui_queue_pending 3\n", comfyui.ENGINE.metrics, "comfyui")
    assert (load.running, load.waiting, load.kv_cache_usage) == (1, 3, None)


def test_weights_appear_under_their_own_names_by_kind(tmp_path: Path) -> None:
    ckpt, vae = tmp_path / "a" / "flux.safetensors", tmp_path / "b" / "ae.safetensors"
    for path in (ckpt, vae):
        path.parent.mkdir()
        path.write_bytes(b"x")
    links = weight_links(parse_pairs([f"flux.safetensors={ckpt}", f"vae/ae.safetensors={vae}"], "--weights"))
    base = tmp_path / "base"
    prepare_base(base, links)
    assert (base / "models" / "vae" / "ae.safetensors").resolve() == vae.resolve()
    assert not (base / "models" / "checkpoints" / "ae.safetensors").exists()
    for kind in WEIGHT_KINDS:  # a bare name: whichever loader a workflow uses finds it
        assert (base / "models" / kind / "flux.safetensors").resolve() == ckpt.resolve()
    assert all((base / own).is_dir() for own in ("input", "output", "custom_nodes", "user"))


def test_two_weights_files_of_one_name_are_refused(tmp_path: Path) -> None:
    one, other = tmp_path / "1" / "model.safetensors", tmp_path / "2" / "model.safetensors"
    for path in (one, other):
        path.parent.mkdir()
        path.write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"two weights files are named model\.safetensors") as refused:
        weight_links([("model.safetensors", one), ("loras/model.safetensors", other)])
    assert "rename one" in str(refused.value)
    assert len(weight_links([("model.safetensors", one), ("model.safetensors", one)])) == 1  # the same file


def test_an_unknown_model_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="model folder 'weights'"):
        weight_links([("weights/x.safetensors", tmp_path / "x")])
    with pytest.raises(ConfigError, match="NAME=PATH"):
        parse_pairs(["nothing"], "--weights")


def test_a_hugging_face_repository_is_linked_into_the_offline_cache(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    (repo / "config.yaml").write_text("a: 1")
    (repo / "sub" / "model.ckpt").write_bytes(b"m")
    hub = tmp_path / "hf" / "hub"
    snapshot = link_hf_repo(hub, "stabilityai/TripoSR", repo)
    cached = hub / "models--stabilityai--TripoSR"
    assert (cached / "refs" / "main").read_text() == snapshot.name
    assert snapshot.parent == cached / "snapshots" and len(snapshot.name) == 40
    assert (snapshot / "sub" / "model.ckpt").read_bytes() == b"m"
    with pytest.raises(ConfigError, match="ORG/NAME"):
        link_hf_repo(hub, "../etc", repo)


def test_the_gate_process_stops_comfyui_with_it(tmp_path: Path) -> None:
    programs = write_standins(tmp_path / "bin")
    (tmp_path / "key").write_text("sk-gate\n")
    port = free_port()
    gate = subprocess.Popen(
        [sys.executable, "-m", "llmgw.cli.main", "comfyui-gate", "--port", str(port),
         "--key-file", str(tmp_path / "key"), "--base-dir", str(tmp_path / "base"),
         "--comfyui-python", str(programs.python), "--comfyui-main", str(programs.comfyui_main),
         "--", "--cpu"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:

        def healthy() -> bool:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/health", headers={"Authorization": "Bearer sk-gate"}
            )
            with urllib.request.urlopen(request, timeout=2) as answer:
                return answer.status == 200

        eventually_sync(healthy, timeout_s=60, message="the gate is healthy")
        children = Path(f"/proc/{gate.pid}/task/{gate.pid}/children").read_text().split()
        assert len(children) == 1
        child = int(children[0])
        assert b"--cpu" in Path(f"/proc/{child}/cmdline").read_bytes()  # ComfyUI's args after "--"
        gate.send_signal(signal.SIGTERM)
        assert gate.wait(30) == 0
        eventually_sync(lambda: not _alive(child), timeout_s=10, message="ComfyUI ended with its gate")
    finally:
        if gate.poll() is None:
            gate.kill()
            gate.wait()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return status not in ("Z", "X")


def test_an_empty_key_file_never_serves(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("\n")
    done = subprocess.run(
        [sys.executable, "-m", "llmgw.engines.comfyui_gate", "--port", "1",
         "--key-file", str(tmp_path / "key"),
         "--base-dir", str(tmp_path), "--comfyui-python", "p", "--comfyui-main", "m"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "never serves unguarded" in done.stderr


def test_a_gate_given_two_weights_of_one_name_ends_saying_so(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("k\n")
    for folder in ("1", "2"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "m.safetensors").write_bytes(folder.encode())
    done = subprocess.run(
        [sys.executable, "-m", "llmgw.engines.comfyui_gate", "--port", "1",
         "--key-file", str(tmp_path / "key"),
         "--base-dir", str(tmp_path / "base"), "--comfyui-python", "p", "--comfyui-main", "m",
         "--weights", f"m.safetensors={tmp_path / '1' / 'm.safetensors'}",
         "--weights", f"m.safetensors={tmp_path / '2' / 'm.safetensors'}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "two weights files are named m.safetensors" in done.stderr
