"""Client-given file names: which are refused and what the refusal names; how control characters print."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.core.filenames import MAX_FILENAME_BYTES, escaped, filename_problem, safe_filename


@pytest.mark.parametrize(
    "name", ["model.gguf", "a..b.txt", "..hidden", "ünïcødé 文件.md", "x" * MAX_FILENAME_BYTES, "👩‍💻.txt"]
)
def test_a_plain_name_is_taken_unchanged(name: str) -> None:
    assert filename_problem(name) == ""
    assert safe_filename(name) == name


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("", "is empty"),
        (".", "'.'"),
        ("..", "'..'"),
        ("../x", "'/' (at character 3)"),
        ("a\\b", "'\\\\'"),
        ("a\x00b", "\\x00 (at character 2)"),
        ("a\tb", "\\x09"),
        ("a\x85b", "\\x85"),
        ("evil\u202etxt.exe", "\\u202e"),
        ("é" * 128, "256 bytes long as UTF-8"),
        ("\ud800", "lone surrogate"),
    ],
)
def test_an_unsafe_name_is_refused_naming_what_is_wrong(name: str, said: str) -> None:
    assert said in filename_problem(name)
    with pytest.raises(ValueError, match=r"\w"):
        safe_filename(name)


def test_escaped_writes_control_characters_out_and_leaves_text_alone() -> None:
    assert escaped("plain text, ünï") == "plain text, ünï"
    assert escaped("a\x00b\x1b[2J\nc\u202e") == "a\\x00b\\x1b[2J\\x0ac\\u202e"


@given(st.text())
def test_an_escaped_text_holds_no_control_character_and_a_taken_name_is_escaped_unchanged(text: str) -> None:
    shown = escaped(text)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in shown)
    if not filename_problem(text):
        assert shown == text
