"""llama.cpp profiles' ``ctx_size`` becomes the context of one request, as on every other engine.

llama.cpp's ``--ctx-size`` is the context of all ``--parallel`` slots together,
and llmgw used to pass a profile's ``ctx_size`` to it as is; it now passes
``ctx_size x parallel``. So that the engines of the models already defined
start exactly as before, each stored llama.cpp profile (engine unset or
``llama.cpp``) gets ``ctx_size // parallel`` (at least 1), the unset defaults
written out (ctx_size 4096, parallel 4). Profiles of other engines are left as
they are. Downgrading multiplies back (a context the division rounded down
stays rounded).

Revision ID: 0019
Revises: 0018
Created: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

from llmgw.core.engines import LLAMA_CPP

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CTX_SIZE = 4096
PARALLEL = 4
"""A profile's defaults when these were written (:class:`llmgw.core.catalog.Profile`)."""

_models = sa.table("models", sa.column("name", sa.String), sa.column("definition", sa.JSON))

Change = Callable[[int, int], int]


def upgrade() -> None:
    _rewrite(per_request)


def downgrade() -> None:
    _rewrite(all_slots)


def per_request(ctx_size: int, parallel: int) -> int:
    """A total llama.cpp context as the context of one of ``parallel`` requests."""
    return max(1, ctx_size // parallel)


def all_slots(ctx_size: int, parallel: int) -> int:
    """The context of one request as llama.cpp's total for ``parallel`` slots."""
    return ctx_size * parallel


def _rewrite(change: Change) -> None:
    bind = op.get_bind()
    for name, definition in bind.execute(sa.select(_models.c.name, _models.c.definition)).all():
        changed = rewritten(definition, change)
        if changed is not None:
            bind.execute(_models.update().where(_models.c.name == name).values(definition=changed))


def rewritten(definition: Any, change: Change) -> dict[str, Any] | None:
    """``definition`` with its llama.cpp profiles' ``ctx_size`` changed; None when none is."""
    if not isinstance(definition, dict):
        return None
    out = dict(definition)
    touched = False
    for field in ("profiles", "profile"):
        value = definition.get(field)
        if field == "profiles" and isinstance(value, list):
            profiles = [_profile(p, change) for p in value]
            if any(new is not None for new in profiles):
                out[field] = [
                    new if new is not None else old for new, old in zip(profiles, value, strict=True)
                ]
                touched = True
        elif field == "profile" and (new := _profile(value, change)) is not None:
            out[field] = new
            touched = True
    return out if touched else None


def _profile(profile: Any, change: Change) -> dict[str, Any] | None:
    if not isinstance(profile, dict) or profile.get("engine", LLAMA_CPP.name) != LLAMA_CPP.name:
        return None
    ctx_size, parallel = profile.get("ctx_size", CTX_SIZE), profile.get("parallel", PARALLEL)
    if not isinstance(ctx_size, int) or not isinstance(parallel, int) or ctx_size <= 0 or parallel < 1:
        return None  # not a valid profile (or 0, the model's own context): nothing to keep the same
    return {**profile, "ctx_size": change(ctx_size, parallel), "parallel": parallel}
