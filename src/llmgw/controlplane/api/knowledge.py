"""``/api/knowledge``: collections, their documents and pairs, and search.

A collection is owned like a model: creating it, uploading to it and
deleting need a member over its owner; one the caller does not see answers
404, as one that does not exist. An upload is read and split before
anything is embedded (a file of another kind, or one that does not parse, is
a 400 naming it); with ``?progress=true`` the answer is JSON Lines, one
``{"embedded": N, "of": M}`` per batch and the document last (or
``{"error": ...}``). docs/knowledge.md tells the whole.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Body, Query, Response
from fastapi.responses import StreamingResponse

from llmgw.adminapi.knowledge import (
    CollectionCreate,
    CollectionDetail,
    CollectionView,
    DocumentView,
    PairsAdded,
    PassageView,
    SearchRequest,
)
from llmgw.adminapi.textfields import checked_text
from llmgw.controlplane.admin.callers import Caller
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import AUTH, AdminState, State, Who
from llmgw.core.catalog import parse_model
from llmgw.core.engines import Task
from llmgw.core.knowledge import SERVING_AN_EMBEDDING_MODEL, UnknownCollection
from llmgw.core.tenancy import Action, Owner, OwnerKind
from llmgw.errors import LlmgwError, NotFound, ValidationFailed
from llmgw.knowledge.ingesting import parse_pairs
from llmgw.knowledge.searching import Mode
from llmgw.knowledge.service import EMBEDDING_MODEL_SETTING, Knowledge
from llmgw.store.knowledge import LIST_HINT, CollectionRecord, DocumentRecord

router = APIRouter(
    prefix="/api/knowledge", tags=["knowledge"], dependencies=AUTH, responses=declared(401, 403, 503)
)

RawBody = Annotated[bytes, Body(media_type="application/octet-stream")]


def _knowledge(state: AdminState) -> Knowledge:
    if state.knowledge is None:
        raise LlmgwError(
            "this control plane keeps no knowledge collections", "start it with llmgw server run"
        )
    return state.knowledge


def _view(record: CollectionRecord) -> CollectionView:
    return CollectionView(
        name=record.name,
        owner=str(record.owner),
        embedding_model=record.embedding_model,
        created_by=record.created_by,
        created_at=record.created_at,
        documents=record.documents,
        passages=record.passages,
    )


def _document(record: DocumentRecord) -> DocumentView:
    return DocumentView(
        name=record.name,
        kind=record.kind,
        size=record.size,
        sha256=record.sha256,
        passages=record.passages,
        uploaded_by=record.uploaded_by,
        uploaded_at=record.uploaded_at,
    )


async def _seen(knowledge: Knowledge, caller: Caller, name: str) -> CollectionRecord:
    checked_text("name", name)
    try:
        record = await knowledge.store.knowledge.get(name)
    except NotFound:
        record = None
    if record is None or not caller.sees(record.owner):
        raise NotFound(f"collection {name!r} does not exist", LIST_HINT)
    return record


async def _writable(state: AdminState, caller: Caller, name: str) -> tuple[Knowledge, CollectionRecord]:
    knowledge = _knowledge(state)
    record = await _seen(knowledge, caller, name)
    caller.check(Action.WRITE, record.owner)
    return knowledge, record


@router.get("/collections", response_model=list[CollectionView])
async def list_collections(state: State, caller: Who) -> list[CollectionView]:
    """Every collection the caller sees, with its documents and passages counted."""
    records = await _knowledge(state).store.knowledge.list()
    return [_view(r) for r in records if caller.sees(r.owner)]


@router.post("/collections", status_code=201, response_model=CollectionView, responses=declared(400, 409))
async def create_collection(body: CollectionCreate, state: State, caller: Who) -> CollectionView:
    """Create an empty collection owned by ``owner``, embedded with ``embedding_model``."""
    knowledge = _knowledge(state)
    owner = Owner.parse(body.owner)
    caller.check(Action.WRITE, owner)
    if owner.kind is OwnerKind.USER:
        if owner.path not in {u.name for u in await state.store.users.list()}:
            raise ValidationFailed(
                [("owner", f"{owner} does not exist")], "'llmgw ctl user list' lists the users"
            )
    elif not owner.public and not await state.store.tenants.exists(owner):
        raise ValidationFailed(
            [("owner", f"{owner} does not exist")], "create it first ('llmgw ctl org|team|project')"
        )
    model = body.embedding_model or await knowledge.default_model()
    await _check_embedding_model(state, model)
    await knowledge.ensure_key(state.on_keys_changed)
    record = await knowledge.store.knowledge.create(body.name, owner, model, caller.name)
    await state.store.audit.record(caller.name, "knowledge.create", body.name, body.model_dump())
    return _view(record)


async def _check_embedding_model(state: AdminState, model: str) -> None:
    hint = (
        "name a public model with serves: embeddings, or set a default with "
        f"'llmgw ctl config set {EMBEDDING_MODEL_SETTING} MODEL'; {SERVING_AN_EMBEDDING_MODEL}"
    )
    if not model:
        raise ValidationFailed([("embedding_model", "none named and no default is set")], hint)
    try:
        record = await state.store.models.get(model)
    except NotFound:
        raise ValidationFailed([("embedding_model", f"{model!r} is not in the catalog")], hint) from None
    definition = parse_model(record.definition)
    if definition.profile.serves is not Task.EMBEDDINGS:
        raise ValidationFailed([("embedding_model", f"{model!r} serves {definition.profile.serves}")], hint)
    if not record.owner.public:
        raise ValidationFailed(
            [
                (
                    "embedding_model",
                    f"{model!r} is owned by {record.owner}: the control plane's key sees public models only",
                )
            ],
            hint,
        )


@router.get("/collections/{name}", response_model=CollectionDetail, responses=declared(400, 404))
async def get_collection(name: str, state: State, caller: Who) -> CollectionDetail:
    """One collection with its documents."""
    knowledge = _knowledge(state)
    record = await _seen(knowledge, caller, name)
    documents = await knowledge.store.knowledge.documents(name)
    return CollectionDetail(**_view(record).model_dump(), document_list=[_document(d) for d in documents])


@router.delete("/collections/{name}", status_code=204, response_class=Response, responses=declared(400, 404))
async def delete_collection(name: str, state: State, caller: Who) -> Response:
    """Delete a collection with its documents, passages and pairs."""
    knowledge, record = await _writable(state, caller, name)
    await knowledge.store.knowledge.delete(name)
    knowledge.index.forget(record.id)
    await state.store.audit.record(caller.name, "knowledge.delete", name, {})
    return Response(status_code=204)


@router.put(
    "/collections/{name}/documents/{document}",
    status_code=201,
    response_model=DocumentView,
    responses=declared(400, 404),
)
async def upload_document(
    name: str,
    document: str,
    data: RawBody,
    state: State,
    caller: Who,
    progress: Annotated[bool, Query(description="Answer JSON Lines with progress per batch.")] = False,
) -> Response | DocumentView:
    """Upload (or replace) a document: .txt, .md, .html or .pdf, as the request's body."""
    knowledge, record = await _writable(state, caller, name)
    prepared = knowledge.ingesting.prepare(document, data)
    await knowledge.ensure_key(state.on_keys_changed)
    if not progress:
        stored = await knowledge.ingesting.store(record, prepared, caller.name)
        knowledge.index.build_soon(record)  # the next search here finds the new index built
        await state.store.audit.record(
            caller.name, "knowledge.upload", f"{name}/{document}", {"sha256": stored.sha256}
        )
        return _document(stored)

    async def lines() -> AsyncIterator[bytes]:
        told: list[tuple[int, int]] = []
        task_result: list[DocumentRecord] = []

        def tell(done: int, total: int) -> None:
            told.append((done, total))

        work = asyncio.ensure_future(knowledge.ingesting.store(record, prepared, caller.name, tell))
        sent = 0
        while True:
            done = work.done()
            while sent < len(told):
                yield _line({"embedded": told[sent][0], "of": told[sent][1]})
                sent += 1
            if done:
                break
            await asyncio.wait({work}, timeout=0.5)
        try:
            task_result.append(work.result())
        except LlmgwError as error:
            yield _line({"error": {"message": error.message, "hint": error.hint}})
            return
        knowledge.index.build_soon(record)
        await state.store.audit.record(
            caller.name, "knowledge.upload", f"{name}/{document}", {"sha256": prepared.sha256}
        )
        yield _line({"document": _document(task_result[0]).model_dump(mode="json")})

    return StreamingResponse(lines(), status_code=201, media_type="application/x-ndjson")


def _line(item: object) -> bytes:
    return json.dumps(item).encode() + b"\n"


@router.delete(
    "/collections/{name}/documents/{document}",
    status_code=204,
    response_class=Response,
    responses=declared(400, 404),
)
async def remove_document(name: str, document: str, state: State, caller: Who) -> Response:
    """Remove one document and its passages."""
    knowledge, record = await _writable(state, caller, name)
    await knowledge.store.knowledge.remove_document(name, document)
    knowledge.index.build_soon(record)
    await state.store.audit.record(caller.name, "knowledge.remove", f"{name}/{document}", {})
    return Response(status_code=204)


@router.post(
    "/collections/{name}/pairs", status_code=201, response_model=PairsAdded, responses=declared(400, 404)
)
async def add_pairs(name: str, data: RawBody, state: State, caller: Who) -> PairsAdded:
    """Add question/answer pairs for training: JSON Lines of {"question": ..., "answer": ...}."""
    knowledge, _ = await _writable(state, caller, name)
    pairs = parse_pairs(data)
    total = await knowledge.store.knowledge.set_pairs(name, pairs)
    await state.store.audit.record(caller.name, "knowledge.pairs", name, {"added": len(pairs)})
    return PairsAdded(collection=name, added=len(pairs), pairs=total)


@router.post("/search", response_model=list[PassageView], responses=declared(400, 404))
async def search(body: SearchRequest, state: State, caller: Who) -> list[PassageView]:
    """The best passages of the collections for the query: hybrid (vector and keyword fused),
    vector or keyword."""
    knowledge = _knowledge(state)
    try:
        records = await knowledge.index.readable(body.collections, caller.sees)
    except UnknownCollection as error:
        raise NotFound(str(error), LIST_HINT) from None
    found = await knowledge.index.search_in(records, body.query, body.limit, Mode(body.mode))
    return [
        PassageView(
            collection=p.collection, document=p.document, position=p.position, text=p.text, score=p.score
        )
        for p in found
    ]
