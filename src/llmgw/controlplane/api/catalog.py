"""``/api/models``: the model catalog. A definition is added only when every file it names is mirrored.

A model's replica counts change in place (``PUT /api/models/{name}/replicas``):
the reconciler's next pass scales to them, draining the replicas above a
lower ``max`` (their requests finish; no new one is sent to them).

A model has an owner (the definition's ``owner``): adding or removing it
needs a member over that owner; a model the caller does not see (neither
visible from the caller's place nor readable by role) is absent from the
listing and answers 404, as one never defined.

A provider model's key is taken when the model is added and never shown
again: every definition read back, and the audit log, say ``set`` in its place.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from pydantic import ValidationError

from llmgw.adminapi.schemas import ModelEntry, ModelView
from llmgw.adminapi.textfields import checked_text
from llmgw.controlplane.admin.callers import Caller
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import AUTH, AdminState, State, Who
from llmgw.core.catalog import (
    ModelDefinition,
    Replicas,
    adapter_problems,
    name_clashes,
    parse_model,
    problems_of,
)
from llmgw.core.environments import is_entry
from llmgw.core.fallbacks import Target, fallback_problems, falling_to
from llmgw.core.providers import shown_definition, shown_key
from llmgw.core.tenancy import Action, OwnerKind
from llmgw.errors import Conflict, LlmgwError, NotFound, ValidationFailed
from llmgw.mirror.blobs import BlobStore
from llmgw.store.catalog import ModelRecord

router = APIRouter(prefix="/api", tags=["models"], dependencies=AUTH, responses=declared(401, 403, 503))


async def _seen(state: AdminState, caller: Caller, name: str) -> ModelRecord:
    record = await state.store.models.get(name)
    if not caller.sees(record.owner):
        raise NotFound(f"model {name!r} is not in the catalog", "llmgw ctl models lists the catalog")
    return record


@router.get("/models", response_model=list[ModelView])
async def list_models(state: State, caller: Who) -> list[ModelView]:
    """Every model the caller sees with its replicas, those ready, and why it is unplaced (if it is)."""
    out = []
    for record in await state.store.models.list():
        if not caller.sees(record.owner):
            continue
        mine = [r for r in state.fleet.of_model(record.name) if r.rank == 0]  # a multi-node replica: its head
        definition, problem = _stored(record.definition)
        out.append(
            ModelView(
                name=record.name,
                definition=_shown(definition) if definition is not None else None,
                replicas=len(mine),
                ready=sum(1 for r in mine if r.state == "ready"),
                unplaced=state.reconciler.unplaced.get(record.name, ""),
                problem=problem,
                provider_error=health.last_error
                if (health := state.provider_health().get(record.name))
                else "",
            )
        )
    return out


@router.get("/models/{name:path}", response_model=ModelEntry, responses=declared(400, 404))
async def get_model(name: str, state: State, caller: Who) -> ModelEntry:
    """One model's definition."""
    checked_text("name", name)
    record = await _seen(state, caller, name)
    definition, problem = _stored(record.definition)
    if definition is None:
        raise LlmgwError(problem, f"remove the model ('llmgw ctl model remove {name}') and add it again")
    return ModelEntry(name=record.name, definition=_shown(definition))


@router.post("/models", status_code=201, response_model=ModelEntry, responses=declared(400, 404, 409))
async def add_model(model: ModelDefinition, state: State, caller: Who) -> ModelEntry:
    """Add a model; the reconciler places its replicas. Its weights (and every other file) must be
    in the mirror already, and its name may not clash with another model's or adapter's."""
    owner = model.owned_by()
    caller.check(Action.WRITE, owner)
    problems = adapter_problems(model.profile.engine, model.name, model.adapters)
    if problems:
        raise ValidationFailed(problems, "fix the adapters named and try again")
    owners = [("owner", owner)] + [
        (f"adapters.{n}.owner", model.adapter_owner(a)) for n, a in enumerate(model.adapters) if a.owner
    ]
    for at, named in owners:
        if named.kind is OwnerKind.USER:
            if named.path not in {u.name for u in await state.store.users.list()}:
                raise ValidationFailed(
                    [(at, f"{named} does not exist")], "'llmgw ctl user list' lists the users"
                )
        elif not await state.store.tenants.exists(named):
            raise ValidationFailed(
                [(at, f"{named} does not exist")], "create it first ('llmgw ctl org|team|project')"
            )
    definition = model.model_dump(mode="json")
    files = _mirror_files(definition)
    missing = [
        (f"{at}.sha256", _not_in_mirror(entry)) for at, entry in files if not state.blobs.has(entry["sha256"])
    ]
    others = await _readable(state)
    targets = {other.name: _target(other) for other in others if other.name != model.name}
    problems = missing + name_clashes(model, others) + fallback_problems(model.name, _target(model), targets)
    if problems:
        raise ValidationFailed(
            problems, "import missing files with 'llmgw mirror import FILE'; rename what clashes"
        )
    _fill_sizes(files, state.blobs)
    await state.store.models.add(model.name, definition)
    await state.store.audit.record(caller.name, "model.add", model.name, shown_definition(definition))
    state.changes.changed("models")
    state.reconciler.wake()
    return ModelEntry(name=model.name, definition=_shown(ModelDefinition.model_validate(definition)))


@router.delete("/models/{name:path}", status_code=204, response_class=Response, responses=declared(400, 404))
async def remove_model(name: str, state: State, caller: Who) -> Response:
    """Remove a model; its replicas stop."""
    checked_text("name", name)
    record = await _seen(state, caller, name)
    caller.check(Action.WRITE, record.owner)
    falling = falling_to(name, {other.name: _target(other) for other in await _readable(state)})
    if falling:
        raise Conflict(
            f"model {name!r} is a fallback of {', '.join(falling)}",
            "remove those models (or add them again without it in their fallbacks) first",
        )
    await state.store.models.remove(name)
    await state.store.audit.record(caller.name, "model.remove", name)
    state.changes.changed("models")
    state.reconciler.wake()
    return Response(status_code=204)


@router.put("/models/{name:path}/replicas", response_model=ModelEntry, responses=declared(400, 404, 409))
async def scale_model(name: str, replicas: Replicas, state: State, caller: Who) -> ModelEntry:
    """Set a model's replica counts (min, max, cool-downs, drain timeout); the next pass scales to them.
    Replicas above a lower ``max`` drain: their requests finish, then they stop."""
    checked_text("name", name)
    record = await _seen(state, caller, name)
    caller.check(Action.WRITE, record.owner)
    current, problem = _stored(record.definition)
    if current is None:
        raise Conflict(problem, f"remove the model ('llmgw ctl model remove {name}') and add it again")
    if is_entry(current):
        raise Conflict(
            f"model {name!r} is an environment's entry: its replicas follow the environment's members",
            "scale the models of its environment instead",
        )
    try:
        scaled = ModelDefinition.model_validate({**record.definition, "replicas": replicas.model_dump()})
    except ValidationError as error:
        raise ValidationFailed(problems_of(error), "set replicas the rest of the definition allows") from None
    definition = scaled.model_dump(mode="json")
    await state.store.models.put(name, definition)
    before = current.replicas.model_dump(mode="json")
    after = definition["replicas"]
    await state.store.audit.record(caller.name, "model.scale", name, {"before": before, "after": after})
    state.changes.changed("models")
    state.reconciler.wake()
    return ModelEntry(name=name, definition=_shown(scaled))


async def _readable(state: AdminState) -> list[ModelDefinition]:
    """The catalog's models whose stored definitions still read."""
    models = []
    for record in await state.store.models.list():
        try:
            models.append(parse_model(record.definition))
        except ValidationFailed:
            continue  # the reconciler reports a stored definition it cannot read
    return models


def _target(model: ModelDefinition) -> Target:
    return Target(model.fallbacks, model.profile.serves.value)


def _shown(model: ModelDefinition) -> ModelDefinition:
    """``model`` as /api shows it: a provider's key ``set``, never itself."""
    if model.provider is None:
        return model
    return model.model_copy(update={"provider": shown_key(model.provider)})


def _stored(definition: dict[str, Any]) -> tuple[ModelDefinition | None, str]:
    """A stored definition read back, or why it no longer reads."""
    try:
        return ModelDefinition.model_validate(definition), ""
    except ValidationError as error:
        text = "; ".join(f"{f}: {why}" if f else why for f, why in problems_of(error))
        return None, f"the stored definition does not read: {text}"


def _fill_sizes(files: list[tuple[str, dict[str, Any]]], blobs: BlobStore) -> None:
    for _, entry in files:
        if not entry["size"]:
            entry["size"] = blobs.path_of(entry["sha256"]).stat().st_size


def _not_in_mirror(entry: dict[str, Any]) -> str:
    return f"no {entry['filename'] or 'file'} with sha256 {entry['sha256'][:12]}… in the mirror"


def _mirror_files(definition: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every file a dumped model definition takes from the mirror, with its field path.

    The weights, the projector, the repository's other files, each adapter's
    weights and other files: the entries themselves, so their sizes can be filled in.
    """
    source = definition["source"]
    if source is None:  # served by its provider
        return []
    files = [("source", source)]
    if source.get("projector"):
        files.append(("source.projector", source["projector"]))
    files += [(f"source.files.{n}", entry) for n, entry in enumerate(source["files"])]
    for index, adapter in enumerate(definition["adapters"]):
        files.append((f"adapters.{index}", adapter))
        files += [(f"adapters.{index}.files.{n}", entry) for n, entry in enumerate(adapter["files"])]
    return files
