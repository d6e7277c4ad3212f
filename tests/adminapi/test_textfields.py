"""The admin API's text sizes are the store's column sizes."""

from __future__ import annotations

import pytest
from sqlalchemy import String
from sqlalchemy.orm import InstrumentedAttribute

from llmgw.adminapi import textfields
from llmgw.store.tables import ApiKeyRow, AuditRow, BlobRow, ModelRow, SettingRow


@pytest.mark.parametrize(
    ("size", "column"),
    [
        ("KEY_NAME", ApiKeyRow.name),
        ("KEY_OWNER", ApiKeyRow.owner),
        ("KEY_PLACE", ApiKeyRow.place_path),
        ("MODEL_NAME", ModelRow.name),
        ("BLOB_FILENAME", BlobRow.filename),
        ("SETTING_KEY", SettingRow.key),
        ("AUDIT_TARGET", AuditRow.target),
    ],
)
def test_each_size_is_its_columns(size: str, column: InstrumentedAttribute[str]) -> None:
    kind = column.expression.type
    assert isinstance(kind, String)
    assert getattr(textfields, size) == kind.length, f"{size} differs from {column}: follow the migration"
