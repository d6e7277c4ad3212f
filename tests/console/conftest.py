"""A real admin API on a loopback port (uvicorn in a thread) for the console to talk to."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.client.admin import AdminClient
from llmgw.testing.admin import admin_app
from llmgw.testing.serving import served_in_thread

TOKEN = "llmgw-admin-console-test"


@pytest.fixture
def admin_client(tmp_path: Path) -> Iterator[AdminClient]:
    with served_in_thread(lambda: admin_app(tmp_path, token=TOKEN)) as url:
        yield AdminClient(url, TOKEN)
