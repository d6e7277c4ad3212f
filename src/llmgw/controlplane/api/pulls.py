"""``/api/mirror/pulls``: models pulled from Hugging Face or Ollama's registry into the mirror, as jobs.

``POST`` starts a pull (or answers the one of that source already running) and
returns at once (202); ``GET /api/mirror/pulls/{id}`` shows its files, bytes
received and state, and once done the model's catalog source. Starting one
needs a member's role somewhere, as an upload does; what it brings is counted
as its caller's in the mirror (``mirror.quota_bytes``), and none starts once
that quota is used up.
"""

from __future__ import annotations

from fastapi import APIRouter

from llmgw.adminapi.pulls import PullFileView, PullRequest, PullView
from llmgw.adminapi.textfields import checked_text
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.mirror import check_room
from llmgw.controlplane.api.state import AUTH, State, Who
from llmgw.core.tenancy import Role
from llmgw.errors import Forbidden
from llmgw.mirror.pulling import Pull

router = APIRouter(prefix="/api", tags=["mirror"], dependencies=AUTH, responses=declared(401, 503))


@router.get("/mirror/pulls", response_model=list[PullView])
async def list_pulls(state: State) -> list[PullView]:
    """Every pull since this control plane started, oldest first."""
    return [pull_view(p) for p in state.pulls.all()]


@router.get("/mirror/pulls/{pull_id}", response_model=PullView, responses=declared(404))
async def get_pull(pull_id: str, state: State) -> PullView:
    """One pull: its files, bytes received, state, and once done the model's catalog source."""
    return pull_view(state.pulls.get(checked_text("pull_id", pull_id)))


@router.post("/mirror/pulls", status_code=202, response_model=PullView, responses=declared(400, 403, 413))
async def start_pull(body: PullRequest, state: State, caller: Who) -> PullView:
    """Start pulling ``hf:ORG/REPO[@REVISION]`` or ``ollama:NAME[:TAG]`` into the mirror; each file is
    checked against the registry's own checksum before it is kept, and counted as the caller's (413
    when the caller's quota is already used up)."""
    checked_text("source", body.source)
    if (caller.highest() or 0) < Role.MEMBER:
        raise Forbidden(
            f"{caller.name} may not pull into the mirror: that needs a member's role somewhere",
            "ask an administrator for a member's role in a team or organization",
        )
    await check_room(state, caller)
    token = body.hf_token.get_secret_value() if body.hf_token is not None else None
    return pull_view(state.pulls.start(body.source, caller.name, token))


def pull_view(pull: Pull) -> PullView:
    return PullView(
        id=pull.id,
        source=pull.source,
        state=pull.state,  # type: ignore[arg-type]
        started=pull.started,
        revision=pull.revision,
        files=[PullFileView(**vars(f)) for f in pull.files],
        bytes_done=pull.bytes_done,
        bytes_total=pull.bytes_total,
        error=pull.error,
        hint=pull.hint,
        catalog_source=pull.catalog_source,
    )
