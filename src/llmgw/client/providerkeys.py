"""A provider model's secret key, read on this machine from a file or an environment variable.

A definition file names where its provider's key is (``provider.key_file`` or
``provider.key_env``), never the key itself, so the key is in no shell history,
process list or committed file; :func:`resolve_key` reads it into ``provider.key``,
which is what ``/api`` takes (and never shows again).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from llmgw.errors import ValidationFailed

KEY_FIELDS = ("key_file", "key_env")
"""Where a definition file may say the provider's key is."""


def read_key(key_file: Path | None, key_env: str | None, at: str = "provider") -> str:
    """The key in ``key_file`` (its trailing newline removed) or in the variable ``key_env``; empty
    when neither is given."""
    if key_file is not None and key_env:
        raise ValidationFailed([(f"{at}.key_file", "give key_file or key_env, not both")])
    if key_file is not None:
        try:
            key = Path(key_file).expanduser().read_text().strip()
        except (OSError, UnicodeDecodeError) as error:
            raise ValidationFailed(
                [(f"{at}.key_file", f"cannot read {key_file}: {error}")],
                "name a readable file that holds the provider's key on one line",
            ) from None
        if not key:
            raise ValidationFailed([(f"{at}.key_file", f"{key_file} is empty")], "put the key in the file")
        return key
    if key_env:
        key = os.environ.get(key_env, "").strip()
        if not key:
            raise ValidationFailed(
                [(f"{at}.key_env", f"the environment variable {key_env} is not set or empty")],
                f"export {key_env} with the provider's key, or give key_file",
            )
        return key
    return ""


def resolve_key(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a definition as a file holds it) with its provider's ``key_file`` / ``key_env`` read
    into ``key``; a key written in the file itself is refused."""
    section = data.get("provider")
    if not isinstance(section, dict):
        return data
    if section.get("key"):
        raise ValidationFailed(
            [("provider.key", "is the secret itself; a definition file names where the key is")],
            "give provider.key_file (a file holding the key) or provider.key_env (a variable's name)",
        )
    rest = {name: value for name, value in section.items() if name not in KEY_FIELDS and name != "key"}
    key_file = section.get("key_file")
    key = read_key(Path(str(key_file)) if key_file else None, section.get("key_env") or None)
    return {**data, "provider": {**rest, "key": key} if key else rest}
