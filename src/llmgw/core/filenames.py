"""File names a client gives (an upload's ``filename``): what one may hold, and how to print one.

A client-given name is kept and shown back, and some are written to disk under
it (a model's file on a node, a training upload), so every place that takes one
refuses the same names: empty, longer than :data:`MAX_FILENAME_BYTES` bytes as
UTF-8, holding ``/`` or ``\\`` (a path, not a name), ``.`` or ``..`` (a path's
component), or a control character (NUL, newline, escape…: they end strings in
C, split log lines and move a terminal's cursor). :func:`filename_problem`
says which character is wrong, so the error can name it.

:func:`escaped` is for names kept from before these checks (and other text a
client gave): control characters written as ``\\xNN`` (``\\uNNNN``), so a
table shows them without acting on the terminal.
"""

from __future__ import annotations

import unicodedata

MAX_FILENAME_BYTES = 255
"""The longest name (bytes as UTF-8) most filesystems keep."""


def _control(character: str) -> bool:
    return unicodedata.category(character) in ("Cc", "Cf", "Zl", "Zp") and character != "\u200d"


def _shown(character: str) -> str:
    code = ord(character)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def filename_problem(name: str) -> str:
    """Why ``name`` cannot be a file's name (empty: it can), naming the character at fault."""
    if not name:
        return "is empty; give the file's name, such as model.gguf"
    if name in (".", ".."):
        return f"is {name!r}, a path's component, not a file's name"
    for separator in ("/", "\\"):
        if separator in name:
            at = name.index(separator) + 1
            return f"holds {separator!r} (at character {at}): give the name alone, no path"
    for position, character in enumerate(name, 1):
        if _control(character):
            return (
                f"holds the control character {_shown(character)} (at character {position}); "
                "give a name of printable characters"
            )
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return "holds a lone surrogate (such as \\ud800), which is not text; send valid Unicode"
    if size > MAX_FILENAME_BYTES:
        return f"is {size} bytes long as UTF-8; a file's name is at most {MAX_FILENAME_BYTES}"
    return ""


def safe_filename(name: str) -> str:
    """A pydantic validator: ``name`` unchanged, or :class:`ValueError` saying what is wrong with it."""
    problem = filename_problem(name)
    if problem:
        raise ValueError(problem)
    return name


def escaped(text: str) -> str:
    """``text`` with its control characters written as escapes (``\\x1b``), for a terminal;
    printable text is unchanged."""
    if not any(_control(c) for c in text):
        return text
    return "".join(_shown(c) if _control(c) else c for c in text)
