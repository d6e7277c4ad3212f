"""OpenAI's images API (``POST /v1/images/generations``) on a ComfyUI picture model.

The request's ``prompt``, ``size`` (into the workflow's ``width`` and
``height`` inputs) and ``seed`` go into the model's workflow; ``n`` pictures
are ``n`` runs of it, each a job of its own (:mod:`llmgw.gateway.jobs`) with
seed, seed + 1, ... (a random seed each when none is given and the workflow
takes one). The answer is OpenAI's: ``{"created", "data": [{"b64_json"} |
{"url"}]}``; a ``url`` is the gateway's own ``/v1/files/{id}/content``,
readable for ``files_kept_s`` by the same key (by every key of its place when
the control plane keeps the files: docs/files.md).
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from llmgw.gateway.api_errors import ApiError
from llmgw.gateway.jobs import MadeFile
from llmgw.gateway.workflows import Workflow, parse_size

MAX_IMAGES = 10
"""Pictures one request may ask for (OpenAI's own limit)."""
FORMATS = ("url", "b64_json")


@dataclass(frozen=True, slots=True)
class ImagesRequest:
    """What an images request asks, checked."""

    model: str
    prompt: str
    n: int = 1
    size: tuple[int, int] | None = None
    response_format: str = "url"
    seed: int | None = None


def parse_images(model: str, data: dict[str, Any]) -> ImagesRequest:
    """The request's fields, or a 400 naming the one that is wrong and what it takes."""
    prompt = data.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ApiError(
            400, "'prompt' must be a non-empty string saying what to draw.", "invalid_prompt", "prompt"
        )
    n = data.get("n", 1)
    if n is None:
        n = 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_IMAGES:
        raise ApiError(
            400, f"'n' must be a whole number from 1 to {MAX_IMAGES}, not {n!r}.", "invalid_n", "n"
        )
    size = data.get("size")
    parsed = None if size is None or size == "auto" else parse_size(size)
    response_format = data.get("response_format") or "url"
    if response_format not in FORMATS:
        raise ApiError(
            400,
            f"'response_format' must be 'url' or 'b64_json', not {response_format!r}.",
            "invalid_response_format",
            "response_format",
        )
    seed = data.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ApiError(
            400, f"'seed' must be a whole number of 0 or more, not {seed!r}.", "invalid_seed", "seed"
        )
    return ImagesRequest(model, prompt, n, parsed, response_format, seed)


def graphs_for(request: ImagesRequest, workflow: Workflow) -> list[dict[str, Any]]:
    """One filled workflow per picture asked for (400 when the workflow lacks an input asked of it)."""
    graphs = []
    for i in range(request.n):
        values: dict[str, Any] = {"prompt": request.prompt}
        if request.size is not None:
            values["width"], values["height"] = request.size
        if request.seed is not None:
            values["seed"] = request.seed + i
        elif workflow.takes("seed"):
            values["seed"] = secrets.randbelow(2**32)
        graphs.append(workflow.filled(values, request.model))
    return graphs


def images_body(pictures: list[MadeFile], response_format: str, files_url: str) -> bytes:
    """OpenAI's images answer for the pictures made (their bytes are at hand: made in this process)."""
    if response_format == "b64_json":
        data = [{"b64_json": base64.b64encode(p.data or b"").decode("ascii")} for p in pictures]
    else:
        data = [{"url": f"{files_url}/{p.file_id}/content"} for p in pictures]
    return json.dumps({"created": int(time.time()), "data": data}, separators=(",", ":")).encode()
