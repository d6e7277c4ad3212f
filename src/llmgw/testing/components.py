"""Tests that need a real component the Makefile installs (PostgreSQL, Patroni, sshd, nft, systemd, ...).

Where such a component is missing, its tests skip with a reason made here
(:func:`missing`), so the summary of a run says what was left out and how to
install it. Under ``CI=true`` those skips fail instead (``tests/conftest.py``
turns every skip whose reason starts with :data:`MISSING` into a failure): a
machine that is meant to have everything cannot pass by skipping.
"""

from __future__ import annotations

import os
from typing import NoReturn

MISSING = "missing component:"
"""How the reason of a skip for a missing component starts."""


def missing(component: str, install: str) -> str:
    """The reason a test skips when ``component`` is not here; ``install``: what to run."""
    return f"{MISSING} {component} is not installed here: {install}"


def in_ci() -> bool:
    """True where the environment says this is CI (``CI=true``): missing components fail."""
    return os.environ.get("CI", "").lower() == "true"


def skip_missing(component: str, install: str) -> NoReturn:
    """Skip the running test for lack of ``component`` (a failure under ``CI=true``)."""
    import pytest  # the test kit's one use of pytest, only when a test calls this

    pytest.skip(missing(component, install))
