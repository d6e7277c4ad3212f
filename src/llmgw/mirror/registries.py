"""Talking to the registries: the hub's listing calls, and their refusals put in words.

Hugging Face says why it refused in ``X-Error-Code`` (``GatedRepo``,
``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``); a gated or private
repository answers 401 without a token and 403 with one that has no access.
The token travels only in the ``Authorization`` header of the hub's own
requests; no message here ever carries it.
"""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp

from llmgw.errors import DownloadError, LlmgwError, NotFound, Unauthorized
from llmgw.mirror import huggingface
from llmgw.mirror.downloading import Refusal
from llmgw.mirror.huggingface import RemoteFile, RepoRef
from llmgw.mirror.ollama import ModelName

TOKEN_HINT = (
    "accept the repository's terms on the hub with your account, then pass a token that can read it: "
    "--hf-token (or HF_TOKEN in your or the control plane's environment)"
)
MAX_PAGES = 1000


def hub_refusal(ref: RepoRef) -> Refusal:
    """Turns the hub's refusal of a request about ``ref`` into an error saying what to do."""

    def refusal(status: int, headers: Mapping[str, str], url: str) -> LlmgwError:
        code = headers.get("X-Error-Code", "")
        if code == "GatedRepo" or (status in (401, 403) and code != "RepoNotFound"):
            return Unauthorized(f"{ref}: the hub refused access ({status} {code or 'no access'})", TOKEN_HINT)
        if code == "RepoNotFound" or (status == 404 and not code):
            return NotFound(
                f"{ref}: the hub has no repository {ref.repo} ({status}), or it is private",
                "check the name on the hub; for a private repository pass a token (--hf-token)",
            )
        if code == "RevisionNotFound":
            return NotFound(
                f"{ref}: the repository has no revision {ref.revision}",
                "name a branch, tag or commit the repository has (hf:ORG/REPO@main)",
            )
        if code == "EntryNotFound":
            return NotFound(f"{ref}: {url} is not in the revision", "pull again: the revision may have moved")
        return DownloadError(f"{ref}: the hub answered {status} for {url}", "try again later")

    return refusal


def registry_refusal(name: ModelName) -> Refusal:
    """Turns Ollama's registry's refusal about ``name`` into an error saying what to do."""

    def refusal(status: int, headers: Mapping[str, str], url: str) -> LlmgwError:
        if status == 404:
            return NotFound(
                f"{name}: the registry has no such model or tag ({url})",
                "check the name and tag on ollama.com/library (ollama:NAME:TAG)",
            )
        return DownloadError(f"{name}: the registry answered {status} for {url}", "try again later")

    return refusal


class HubSession:
    """The hub's API calls about one repository, with the token in its headers."""

    def __init__(
        self, session: aiohttp.ClientSession, endpoint: str, ref: RepoRef, token: str | None
    ) -> None:
        self.session = session
        self.endpoint = endpoint
        self.ref = ref
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.refusal = hub_refusal(ref)

    async def commit(self) -> str:
        """The commit the revision stands for (``sha`` of the revision API)."""
        url = huggingface.revision_url(self.endpoint, self.ref)
        async with self.session.get(url, headers=self.headers) as answer:
            if answer.status != 200:
                raise self.refusal(answer.status, answer.headers, url)
            data = await answer.json(content_type=None)
        commit = data.get("sha") if isinstance(data, dict) else None
        if not isinstance(commit, str) or not commit:
            raise DownloadError(
                f"{self.ref}: the hub's revision answer names no commit (sha)",
                "check that mirror.hf_endpoint names a Hugging Face hub",
            )
        return commit

    async def tree(self, commit: str) -> list[RemoteFile]:
        """Every file of the commit, following the listing's pages."""
        url: str | None = huggingface.tree_url(self.endpoint, self.ref, commit)
        files: list[RemoteFile] = []
        for _ in range(MAX_PAGES):
            if url is None:
                return files
            async with self.session.get(url, headers=self.headers) as answer:
                if answer.status != 200:
                    raise self.refusal(answer.status, answer.headers, url)
                files += huggingface.parse_tree(await answer.json(content_type=None))
                url = huggingface.next_page(answer.headers.get("Link", ""))
        raise DownloadError(f"{self.ref}: the hub's listing ran past {MAX_PAGES} pages", "try again later")
