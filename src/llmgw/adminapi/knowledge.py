"""The bodies of ``/api/knowledge``: collections, documents, search requests and passages found."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from llmgw.core.tenancy import owner_text

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class CollectionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, description="Letters, digits, '.', '_' and '-' (128 at most).")
    owner: Annotated[str, AfterValidator(owner_text)] = Field(
        default="", description="Who owns it: '' (the cluster: every key), org:, team:, project: or user:."
    )
    embedding_model: str = Field(
        default="",
        max_length=256,
        description="A public catalog model with serves: embeddings; '' takes the setting "
        "knowledge.embedding_model.",
    )


class DocumentView(BaseModel):
    name: str
    kind: str
    size: int
    sha256: str
    passages: int
    uploaded_by: str
    uploaded_at: datetime


class CollectionView(BaseModel):
    name: str
    owner: str
    embedding_model: str
    created_by: str
    created_at: datetime
    documents: int
    passages: int


class CollectionDetail(CollectionView):
    document_list: list[DocumentView]


class PairsAdded(BaseModel):
    collection: str
    added: int
    pairs: int
    """Pairs the collection holds now."""


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    collections: list[str] = Field(min_length=1, max_length=32)
    query: str = Field(min_length=1, max_length=8192)
    limit: int = Field(default=5, ge=1, le=100)
    mode: str = Field(default="hybrid", pattern="^(hybrid|vector|keyword)$")


class PassageView(BaseModel):
    collection: str
    document: str
    position: int
    text: str
    score: float
