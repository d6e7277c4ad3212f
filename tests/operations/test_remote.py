"""The ssh command line, what ssh's own failures mean, and files written through a shell."""

from __future__ import annotations

import subprocess
from pathlib import Path, PurePosixPath

import pytest

from llmgw.operations.remote import (
    Completed,
    HostKeyRefused,
    LocalShell,
    RemoteError,
    Target,
    classify,
    read_file,
    write_file,
)


def test_the_command_checks_host_keys_strictly_unless_asked_to_record_a_new_one() -> None:
    strict = Target("db1", user="ops", port=2222, identity=Path("/k"), known_hosts=Path("/kh")).command(
        "true"
    )
    assert strict[:5] == ["ssh", "-p", "2222", "-l", "ops"]
    assert "StrictHostKeyChecking=yes" in strict and "BatchMode=yes" in strict
    assert "UserKnownHostsFile=/kh" in strict and strict[strict.index("-i") + 1] == "/k"
    assert strict[-3:-1] == ["--", "db1"]
    assert "StrictHostKeyChecking=accept-new" in Target("db1", accept_host_key=True).command("true")


def test_the_remote_command_is_one_word_the_remote_shell_splits_back_into_the_script() -> None:
    script = "printf '%s|' \"$0\" 'it''s'; echo; echo $((1+2))"
    remote = Target("h").command(script)[-1]
    done = subprocess.run(["sh", "-c", remote], capture_output=True, text=True, check=True)
    assert done.stdout == "sh|its|\n3\n"


@pytest.mark.parametrize(
    ("said", "kind", "words"),
    [
        (b"Host key verification failed.", HostKeyRefused, "--accept-host-key"),
        (b"@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @", HostKeyRefused, "reinstalled"),
        (b"Permission denied (publickey).", RemoteError, "authorized_keys"),
    ],
)
def test_ssh_failures_say_what_to_do(said: bytes, kind: type[RemoteError], words: str) -> None:
    with pytest.raises(kind) as raised:
        classify(Target("h"), Completed(255, b"", said))
    assert words in str(raised.value)


def test_a_command_that_fails_on_the_machine_is_its_callers_to_judge() -> None:
    done = Completed(1, b"", b"no such file")
    assert classify(Target("h"), done) is done


def test_files_are_written_once_with_their_mode_and_read_back(tmp_path: Path) -> None:
    shell = LocalShell()
    path = PurePosixPath(tmp_path / "etc" / "node.key")
    assert read_file(shell, path) is None
    assert write_file(shell, path, b"secret\n", 0o600)
    assert Path(path).stat().st_mode & 0o777 == 0o600
    assert read_file(shell, path) == b"secret\n"
    assert not write_file(shell, path, b"secret\n", 0o600)
    assert write_file(shell, path, b"other\n", 0o600)
    assert Path(path).read_bytes() == b"other\n"
    assert not Path(f"{path}.part").exists()
