"""Engine output files: followed into the shard's log, emptied in place past their limit."""

from __future__ import annotations

import os
from pathlib import Path

from llmgw.agent.engineoutput import OutputFollower, ShardLog, blanked, open_output


def test_output_is_created_for_its_owner_only(tmp_path: Path) -> None:
    descriptor = open_output(tmp_path / "shard" / "output-0.log")
    os.close(descriptor)
    assert (tmp_path / "shard" / "output-0.log").stat().st_mode & 0o777 == 0o600


def test_lines_are_followed_into_the_log_whole(tmp_path: Path) -> None:
    path = tmp_path / "output-0.log"
    descriptor = open_output(path)
    shard_log = ShardLog()
    follower = OutputFollower(path, shard_log, max_bytes=1 << 20)
    os.write(descriptor, b"loading model\nlistening on 127")
    assert follower.poll() == 1
    os.write(descriptor, b".0.0.1\n")
    follower.poll()
    os.close(descriptor)
    assert shard_log.last(10) == ["loading model", "listening on 127.0.0.1"]


def test_a_file_past_its_limit_is_emptied_in_place_and_the_engine_writes_on(tmp_path: Path) -> None:
    path = tmp_path / "output-0.log"
    descriptor = open_output(path)  # the engine's O_APPEND descriptor
    shard_log = ShardLog()
    follower = OutputFollower(path, shard_log, max_bytes=4096)
    line = b"x" * 99 + b"\n"
    for _ in range(50):
        os.write(descriptor, line)
    follower.poll()
    assert follower.emptied == 1
    assert path.stat().st_size == 0
    os.write(descriptor, b"after\n")
    follower.poll()
    os.close(descriptor)
    assert path.read_bytes() == b"after\n"
    assert len(shard_log.lines) == 51 and shard_log.last(1) == ["after"]


def test_a_follower_of_the_log_gets_each_new_line(tmp_path: Path) -> None:
    shard_log = ShardLog(kept=2)
    shard_log.add("one")
    queue = shard_log.follow()
    shard_log.add("two")
    shard_log.add("three")
    shard_log.unfollow(queue)
    shard_log.add("four")
    assert [queue.get_nowait(), queue.get_nowait()] == ["two", "three"]
    assert queue.empty()
    assert shard_log.last(5) == ["three", "four"]


KEY = "llmgw-replica-Zq3"


def test_a_key_the_engine_prints_is_overwritten_in_the_file_and_blanked_in_the_log(tmp_path: Path) -> None:
    path = tmp_path / "output-0.log"
    descriptor = open_output(path)
    shard_log = ShardLog()
    follower = OutputFollower(path, shard_log, max_bytes=1 << 20, secrets=(KEY,))
    os.write(descriptor, f"server_args=ServerArgs(api_key='{KEY}', port=1)\n".encode())
    follower.poll()
    os.write(descriptor, b"serving\n")  # the engine's appends go on at the end
    follower.poll()
    os.close(descriptor)

    masked = "*" * len(KEY)
    assert path.read_text() == f"server_args=ServerArgs(api_key='{masked}', port=1)\nserving\n"
    assert shard_log.last(5) == [f"server_args=ServerArgs(api_key='{masked}', port=1)", "serving"]
    assert follower.blanked == 1


def test_a_key_split_across_two_reads_is_still_found(tmp_path: Path) -> None:
    path = tmp_path / "output-0.log"
    descriptor = open_output(path)
    shard_log = ShardLog()
    follower = OutputFollower(path, shard_log, max_bytes=1 << 20, secrets=(KEY,))
    os.write(descriptor, f"args: {KEY[:7]}".encode())
    follower.poll()
    os.write(descriptor, f"{KEY[7:]} {KEY}\n".encode())
    follower.poll()
    os.close(descriptor)

    assert KEY not in path.read_text()
    assert shard_log.last(1) == [f"args: {'*' * len(KEY)} {'*' * len(KEY)}"]


def test_an_adopted_engines_file_is_blanked_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "output-0.log"
    path.write_text(f"--api-key {KEY}\nready\n")
    shard_log = ShardLog()

    OutputFollower(path, shard_log, max_bytes=1 << 20, secrets=(KEY,)).poll()

    assert KEY not in path.read_text() and KEY not in "\n".join(shard_log.last(5))


def test_blanked_replaces_every_secret(tmp_path: Path) -> None:
    assert blanked(f"exited: {KEY}; {KEY}", (KEY, "")) == f"exited: {'*' * len(KEY)}; {'*' * len(KEY)}"
