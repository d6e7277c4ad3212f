"""``/api/training/jobs``: submit, follow, cancel and publish LoRA training jobs (docs/training.md).

A job has an owner: submitting, cancelling and publishing need a member over
it; a job the caller does not see answers 404, as one never submitted.
"""

from __future__ import annotations

from fastapi import APIRouter

from llmgw.adminapi.training import (
    PublishedAdapter,
    TrainingJobView,
    TrainingLogs,
    TrainingPublish,
    TrainingResult,
    TrainingSubmit,
)
from llmgw.controlplane.admin.callers import ADMIN, Caller
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import AUTH, AdminState, State, Who
from llmgw.core.catalog import PEFT_CONFIG, ModelDefinition, adapter_problems, parse_model
from llmgw.core.tenancy import Action, Owner, OwnerKind
from llmgw.core.training import (
    JOB_ID,
    JobState,
    base_files,
    pairs_bytes,
    parse_options,
    parse_pairs,
    wants_gguf,
)
from llmgw.core.trainingstream import TrainingFile
from llmgw.errors import Conflict, NotFound, ValidationFailed
from llmgw.store.training import JobRecord
from llmgw.training.pairs import gather_pairs
from llmgw.training.publishing import architecture_problems, published_adapter, read_json, with_adapter

router = APIRouter(
    prefix="/api/training", tags=["training"], dependencies=AUTH, responses=declared(401, 403, 503)
)


async def _seen(state: AdminState, caller: Caller, job_id: str) -> JobRecord:
    missing = NotFound(f"no training job {job_id!r}", "'llmgw ctl train list' lists the jobs you see")
    if not JOB_ID.fullmatch(job_id):
        raise missing
    job = await state.store.training.get(job_id)
    if not caller.sees(job.owner):
        raise missing
    return job


async def _model(state: AdminState, caller: Caller, name: str) -> ModelDefinition:
    record = await state.store.models.get(name)
    if not caller.sees(record.owner):
        raise NotFound(f"model {name!r} is not in the catalog", "llmgw ctl models lists the catalog")
    return parse_model(record.definition)


@router.post("/jobs", status_code=201, response_model=TrainingJobView, responses=declared(400, 404))
async def submit(body: TrainingSubmit, state: State, caller: Who) -> TrainingJobView:
    """Queue a job; the leader places it on a node with the room and sends it there."""
    model = await _model(state, caller, body.model)
    options = parse_options(body.options)
    asked = Owner.parse(body.owner) if body.owner is not None else None
    if body.pairs_from:
        if body.pairs:
            raise ValidationFailed(
                [("pairs", "give pairs or pairs_from, not both")], "drop one of --pairs and --pairs-from"
            )
        gathered = await gather_pairs(state.collection_pairs, body.pairs_from, caller.sees, asked)
        owner, pairs = gathered.owner, gathered.pairs
    else:
        pairs = parse_pairs(body.pairs.encode())
        owner = asked or _default_owner(caller, model)
    caller.check(Action.WRITE, owner)
    if not owner.within(model.owned_by()):
        raise ValidationFailed(
            [("owner", f"{owner} is outside the model's owner ({model.owned_by() or 'the cluster'})")],
            "own the job at or below the model's owner",
        )
    named = [TrainingFile(w.sha256.removeprefix("sha256:"), w.filename, 0) for w in body.weights]
    weights = []
    missing = []
    for index, entry in enumerate(base_files(model, named)):
        if not state.blobs.has(entry.sha256):
            missing.append(
                (f"weights.{index}", f"no {entry.filename} with sha256 {entry.sha256[:12]}… in the mirror")
            )
            continue
        size = entry.size or state.blobs.path_of(entry.sha256).stat().st_size
        weights.append({"sha256": entry.sha256, "filename": entry.filename, "size": size})
    if missing:
        raise ValidationFailed(missing, "import the base model's files with 'llmgw mirror import FILE'")
    spec = {
        "device_kind": body.device,
        "weights": weights,
        "options": options.model_dump(mode="json"),
        "gguf": wants_gguf(model) if body.gguf is None else body.gguf,
        "collections": list(body.pairs_from),
        "submitted_by": caller.name,
    }
    job = await state.store.training.add(
        owner=owner,
        model=model.name,
        node=body.node,
        memory_mb=body.memory_mb,
        retry=body.retry,
        spec=spec,
        pairs=pairs_bytes(pairs),
    )
    await state.store.audit.record(
        caller.name, "training.submit", job.id, {"model": model.name, "owner": str(owner)}
    )
    if state.training is not None:
        state.training.wake()
    return job_view(job)


def _default_owner(caller: Caller, model: ModelDefinition) -> Owner:
    """A user's own jobs are the user's; the admin token's are the model's owner's."""
    if caller.name != ADMIN:
        return Owner(OwnerKind.USER, caller.name)
    return model.owned_by()


@router.get("/jobs", response_model=list[TrainingJobView])
async def list_jobs(state: State, caller: Who) -> list[TrainingJobView]:
    """Every job the caller sees, oldest first."""
    return [job_view(job) for job in await state.store.training.list() if caller.sees(job.owner)]


@router.get("/jobs/{job_id}", response_model=TrainingJobView, responses=declared(404))
async def get_job(job_id: str, state: State, caller: Who) -> TrainingJobView:
    """One job: state, step of how many, loss, peak memory, node and card, why it is queued."""
    return job_view(await _seen(state, caller, job_id))


@router.get("/jobs/{job_id}/logs", response_model=TrainingLogs, responses=declared(404))
async def job_logs(job_id: str, state: State, caller: Who) -> TrainingLogs:
    """The last lines of the trainer's output."""
    job = await _seen(state, caller, job_id)
    return TrainingLogs(id=job.id, lines=job.logs)


@router.post("/jobs/{job_id}/cancel", response_model=TrainingJobView, responses=declared(404, 409))
async def cancel(job_id: str, state: State, caller: Who) -> TrainingJobView:
    """Cancel a job that has not ended; its node stops it."""
    job = await _seen(state, caller, job_id)
    caller.check(Action.WRITE, job.owner)
    if state.training is not None:
        return job_view(await state.training.cancel(job.id, caller.name))
    if job.state.ended:
        raise Conflict(f"training job {job.id} has already {job.state.value}", "nothing to cancel")
    changed = await state.store.training.change(
        job.id, state=JobState.CANCELLED, error=f"cancelled by {caller.name}"
    )
    return job_view(changed)


@router.post("/jobs/{job_id}/publish", response_model=PublishedAdapter, responses=declared(400, 404, 409))
async def publish(job_id: str, body: TrainingPublish, state: State, caller: Who) -> PublishedAdapter:
    """Make a succeeded job's adapter an adapter of its model, owned by the job's owner (or one given),
    after the architecture check."""
    job = await _seen(state, caller, job_id)
    if job.state is not JobState.SUCCEEDED:
        raise Conflict(f"training job {job.id} is {job.state.value}", "publish a job once it has succeeded")
    owner = Owner.parse(body.owner) if body.owner is not None else job.owner
    caller.check(Action.WRITE, owner)
    if job.collections and owner.public:
        raise ValidationFailed(
            [("owner", "the job's pairs came from knowledge collections: its adapter is never public")],
            "give an organization, team, project or user as the owner",
        )
    record = await state.store.models.get(job.model)
    model = parse_model(record.definition)
    rank = int(job.options.get("rank", 0))
    adapter_config = read_json(_blob(state, job.results, PEFT_CONFIG), PEFT_CONFIG)
    base_config = read_json(_blob(state, job.weights, "config.json"), "config.json")
    problems = architecture_problems(adapter_config, base_config, job.model, rank)
    if problems:
        raise ValidationFailed(
            problems, f"the adapter does not fit {job.model}: train it again for that model"
        )
    adapter = published_adapter(model, job.results, body.name, owner, rank)
    taken = {r.name for r in await state.store.models.list()} | {
        str(a.get("name")) for r in await state.store.models.list() for a in r.definition.get("adapters", [])
    }
    if adapter.name in taken:
        raise Conflict(f"{adapter.name!r} is already the name of a model or adapter", "choose another --name")
    definition = with_adapter(record.definition, adapter)
    checked = parse_model(definition)
    problems = adapter_problems(checked.profile.engine, checked.name, checked.adapters)
    if problems:
        raise ValidationFailed(problems, "the adapter cannot be served by this model")
    await state.store.models.put(job.model, checked.model_dump(mode="json"))
    await state.store.audit.record(caller.name, "training.publish", job.id, {"adapter": adapter.name})
    state.changes.changed("models")
    state.reconciler.wake()  # it rolls replicas that load adapters only at start (adapterrolling.py)
    return PublishedAdapter(
        model=job.model, name=adapter.name, owner=str(owner), sha256=adapter.sha256, filename=adapter.filename
    )


def _blob(state: AdminState, files: list[dict[str, object]], filename: str) -> bytes:
    for entry in files:
        if entry.get("filename") == filename:
            return state.blobs.path_of(str(entry["sha256"])).read_bytes()
    raise ValidationFailed([("results", f"the job has no {filename}")], "train the job again")


def job_view(job: JobRecord) -> TrainingJobView:
    progress = job.progress
    return TrainingJobView(
        id=job.id,
        owner=str(job.owner),
        model=job.model,
        state=job.state.value,
        node=job.node,
        node_id=job.node_id,
        device=job.device,
        device_kind=job.device_kind,
        memory_mb=job.memory_mb,
        attempt=job.attempt,
        retry=job.retry,
        step=int(progress.get("step", 0)),
        steps=int(progress.get("steps", 0)),
        loss=float(progress.get("loss", 0.0)),
        losses=[(int(s), float(v)) for s, v in progress.get("losses", [])],
        peak_memory_bytes=int(progress.get("peak_memory_bytes", 0)),
        detail=str(progress.get("detail", "")),
        reasons=job.reasons,
        error=job.error,
        gguf=job.gguf,
        options=job.options,
        collections=job.collections,
        results=[TrainingResult.model_validate(r) for r in job.results],
        created_at=job.created_at,
        updated_at=job.updated_at,
        ended_at=job.ended_at,
    )
