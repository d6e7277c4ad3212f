"""The stand-ins take the replica's key the way their engines do: a key file, SGLang's --config."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.testing import llama_server_standin, sglang_standin


def test_llama_server_reads_one_key_a_line_skipping_empty_lines_and_comments(tmp_path: Path) -> None:
    keys = tmp_path / "api-key"
    keys.write_text("# the replica's key\nsk-1\n\nsk-2\n")

    args = llama_server_standin.parse_args(["--api-key-file", str(keys)])

    assert args.api_keys == ["sk-1", "sk-2"]
    assert llama_server_standin.StandIn(args.api_keys, "m", 0).authorizations == {
        b"Bearer sk-1",
        b"Bearer sk-2",
    }


def test_llama_server_ends_on_a_key_file_it_cannot_open(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        llama_server_standin.parse_args(["--api-key-file", str(tmp_path / "gone")])


def test_sglang_merges_its_config_file_before_the_command_line(tmp_path: Path) -> None:
    config = tmp_path / "k.yaml"
    config.write_text('api-key: "sk-1"\nenable-metrics: true\nport: 1\n')
    parser = sglang_standin._parser()

    argv = sglang_standin.merge_config(parser, ["--model-path", "m", "--config", str(config), "--port", "2"])
    options = parser.parse_args(argv)

    assert (options.api_key, options.enable_metrics, options.port) == (
        "sk-1",
        True,
        2,
    )  # the command line wins


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--config", "a.yaml", "--config", "b.yaml"], "Only one allowed"),
        (["--config"], "No config file specified"),
        (["--config", "k.txt"], "must be YAML"),
        (["--config", "gone.yaml"], "not found"),
    ],
)
def test_sglang_refuses_config_files_as_sglang_does(argv: list[str], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        sglang_standin.merge_config(sglang_standin._parser(), argv)
