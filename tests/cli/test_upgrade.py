from pathlib import Path

from llmgw.cli.upgrade import trusted_key_path


def test_the_trusted_key_is_beside_the_config_unless_set(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text("node_id: n1\n")
    assert trusted_key_path(config) == tmp_path / "trusted.pub"
    config.write_text("node_id: n1\nrelease:\n  trusted_pub: keys/release.pub\n")
    assert trusted_key_path(config) == tmp_path / "keys" / "release.pub"
    config.write_text("release:\n  trusted_pub: /etc/llmgw/trusted.pub\n")
    assert trusted_key_path(config) == Path("/etc/llmgw/trusted.pub")
