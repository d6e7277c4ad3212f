"""run_as: engines drop to their own user when the agent is root (C2.5), through a fake user database."""

from __future__ import annotations

import logging
import pwd
from pathlib import Path

import pytest

from llmgw.agent.engineuser import UserLookup, engine_user


def entry(uid: int, gid: int) -> pwd.struct_passwd:
    return pwd.struct_passwd(("llmgw-engine", "x", uid, gid, "", "/nonexistent", "/usr/sbin/nologin"))


def lookup(
    euid: int, users: dict[str, pwd.struct_passwd], chowned: list[tuple[Path, int, int]]
) -> UserLookup:
    def user(name: str) -> pwd.struct_passwd:
        return users[name]

    return UserLookup(
        euid=lambda: euid,
        user=user,
        groups=lambda name, gid: [gid, 44, 109],
        chown=lambda path, uid, gid: chowned.append((path, uid, gid)),
    )


def test_as_root_engines_get_the_user_s_ids_groups_and_a_private_home(tmp_path: Path) -> None:
    chowned: list[tuple[Path, int, int]] = []
    user = engine_user("llmgw-engine", tmp_path, lookup(0, {"llmgw-engine": entry(990, 985)}, chowned))
    assert user is not None
    home = tmp_path / "home" / "llmgw-engine"
    assert (user.uid, user.gid, user.groups, user.home) == (990, 985, (44, 109), home)
    assert home.stat().st_mode & 0o777 == 0o700
    assert chowned == [(home, 990, 985)]
    options = user.spawn_options()
    assert options == {"preexec_fn": user.become, "cwd": home}
    assert user.environment()["HOME"] == str(home)
    assert user.environment()["XDG_CACHE_HOME"] == str(home / ".cache")


def test_without_the_user_engines_run_as_root_and_the_log_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert engine_user("llmgw-engine", tmp_path, lookup(0, {}, [])) is None
    assert "engines run as root" in caplog.text
    assert "useradd --system" in caplog.text
    assert not (tmp_path / "home").exists()


def test_an_agent_that_is_not_root_runs_engines_as_itself(tmp_path: Path) -> None:
    chowned: list[tuple[Path, int, int]] = []
    assert (
        engine_user("llmgw-engine", tmp_path, lookup(1000, {"llmgw-engine": entry(990, 985)}, chowned))
        is None
    )
    assert chowned == []


def test_an_empty_run_as_keeps_engines_as_root(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        assert engine_user("", tmp_path, lookup(0, {"llmgw-engine": entry(990, 985)}, [])) is None
    assert "run_as is empty" in caplog.text
