"""``llmgw ctl train``: LoRA training jobs on the cluster's cards (docs/training.md).

::

    llmgw ctl train submit tiny-llama --pairs pairs.jsonl --memory-mb 8000 --steps 200
    llmgw ctl train submit tiny-llama --pairs-from faq --device cpu --memory-mb 4000 --node n1
    llmgw ctl train status tj_0a1b2c3d4e5f
    llmgw ctl train logs tj_0a1b2c3d4e5f
    llmgw ctl train publish tj_0a1b2c3d4e5f --name tiny-faq
    llmgw ctl train list --json
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from pydantic import TypeAdapter

from llmgw.adminapi.training import PublishedAdapter, TrainingJobView, TrainingLogs
from llmgw.cli.options import AS_JSON, TOKEN, URL, client
from llmgw.cli.output import console, print_json, table
from llmgw.core.training import parse_weight
from llmgw.errors import ValidationFailed

train_app = typer.Typer(
    help="Train LoRA adapters on the cluster's cards and publish them.", no_args_is_help=True
)
JOB = typer.Argument(..., help="The job's id (tj_…, 'llmgw ctl train list' shows them).")
JOBS = "/api/training/jobs"


def _jobs(answer: Any) -> list[TrainingJobView]:
    return TypeAdapter(list[TrainingJobView]).validate_python(answer)


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.0f} MiB" if size else "-"


def _where(job: TrainingJobView) -> str:
    return f"{job.node_id}/{job.device}" if job.node_id else f"({job.node})"


def _show(job: TrainingJobView) -> None:
    rows = [
        ("state", job.state + (f" ({job.detail})" if job.detail else "")),
        ("model", job.model),
        ("owner", job.owner or "cluster"),
        ("node/device", _where(job) + f", {job.memory_mb} MiB on the {job.device_kind}"),
        ("attempt", f"{job.attempt} ({job.retry} retries left)"),
        ("step", f"{job.step} of {job.steps}" if job.steps else "-"),
        ("loss", f"{job.loss:.4f}" if job.steps else "-"),
        ("peak memory", _mib(job.peak_memory_bytes)),
    ]
    if job.reasons:
        rows.append(("queued because", job.reasons))
    if job.error:
        rows.append(("error", job.error))
    rows += [(f"result {r.filename}", f"{r.sha256[:12]}… {r.size} bytes") for r in job.results]
    table(["", job.id], rows)


@train_app.command("submit")
def submit(
    model: str = typer.Argument(..., help="The catalog model the adapter is for."),
    pairs: Path | None = typer.Option(
        None, "--pairs", exists=True, dir_okay=False, help='JSON lines: {"question": ..., "answer": ...}.'
    ),
    pairs_from: list[str] | None = typer.Option(
        None, "--pairs-from", help="A knowledge collection (repeat)."
    ),
    memory_mb: int = typer.Option(
        ..., "--memory-mb", help="MiB the job needs on its card (or host, --device cpu)."
    ),
    device: str = typer.Option("card", "--device", help="card or cpu."),
    node: str = typer.Option("any", "--node", help="The node to train on; any: placement picks."),
    weights: list[str] | None = typer.Option(
        None, "--weights", help="A base file SHA256:FILENAME in the mirror (repeat); none: the model's own."
    ),
    rank: int | None = typer.Option(None, "--rank", help="LoRA rank (8)."),
    alpha: int | None = typer.Option(None, "--alpha", help="LoRA alpha (16)."),
    dropout: float | None = typer.Option(None, "--dropout", help="LoRA dropout (0.05)."),
    steps: int | None = typer.Option(None, "--steps", help="Training steps (100)."),
    learning_rate: float | None = typer.Option(None, "--learning-rate", help="2e-4 by default."),
    seed: int | None = typer.Option(None, "--seed", help="0 by default."),
    target: list[str] | None = typer.Option(
        None, "--target", help="A module to adapt (repeat; q_proj, k_proj, v_proj, o_proj)."
    ),
    gguf: bool | None = typer.Option(
        None, "--gguf/--no-gguf", help="Also make a GGUF adapter (default: llama.cpp)."
    ),
    retry: int = typer.Option(0, "--retry", help="Times it is placed again if its node goes mid-job."),
    owner: str | None = typer.Option(None, "--owner", help="org:…, team:…, project:…, user:…"),
    url: str | None = URL,
    token: str | None = TOKEN,
    as_json: bool = AS_JSON,
) -> None:
    """Submit a training job; it is queued until a node (or card) has the room."""
    if pairs is None and not pairs_from:
        raise ValidationFailed(
            [("pairs", "give --pairs FILE or --pairs-from COLLECTION")],
            'a pairs file holds one {"question": "...", "answer": "..."} a line',
        )
    options = {
        "rank": rank,
        "alpha": alpha,
        "dropout": dropout,
        "steps": steps,
        "learning_rate": learning_rate,
        "seed": seed,
        "target_modules": target or None,
    }
    body: dict[str, Any] = {
        "model": model,
        "pairs": pairs.read_text(encoding="utf-8") if pairs is not None else "",
        "pairs_from": pairs_from or [],
        "memory_mb": memory_mb,
        "device": device,
        "node": node,
        "weights": [{"sha256": w.sha256, "filename": w.filename} for w in map(parse_weight, weights or [])],
        "options": {k: v for k, v in options.items() if v is not None},
        "gguf": gguf,
        "retry": retry,
        "owner": owner,
    }
    job = TrainingJobView.model_validate(client(url, token).request("POST", JOBS, body))
    if as_json:
        print_json(job)
    else:
        console.print(f"training job {job.id} queued ('llmgw ctl train status {job.id}' follows it)")


@train_app.command("status")
def status(
    job_id: str = JOB, url: str | None = URL, token: str | None = TOKEN, as_json: bool = AS_JSON
) -> None:
    """A job's state, step of how many, loss, peak memory, node and card, and why it is queued."""
    job = TrainingJobView.model_validate(client(url, token).request("GET", f"{JOBS}/{job_id}"))
    if as_json:
        print_json(job)
    else:
        _show(job)


@train_app.command("list")
def list_jobs(url: str | None = URL, token: str | None = TOKEN, as_json: bool = AS_JSON) -> None:
    """Every job you see, oldest first."""
    jobs = _jobs(client(url, token).request("GET", JOBS))
    if as_json:
        print_json(jobs)
        return
    table(
        ["ID", "MODEL", "OWNER", "STATE", "WHERE", "STEP", "LOSS", "PEAK"],
        [
            (
                j.id,
                j.model,
                j.owner or "cluster",
                j.state,
                _where(j),
                f"{j.step}/{j.steps}" if j.steps else "-",
                f"{j.loss:.4f}" if j.steps else "-",
                _mib(j.peak_memory_bytes),
            )
            for j in jobs
        ],
    )


@train_app.command("logs")
def logs(
    job_id: str = JOB, url: str | None = URL, token: str | None = TOKEN, as_json: bool = AS_JSON
) -> None:
    """The last lines of the trainer's output."""
    answer = TrainingLogs.model_validate(client(url, token).request("GET", f"{JOBS}/{job_id}/logs"))
    if as_json:
        print_json(answer)
        return
    for line in answer.lines:
        console.print(line, markup=False, highlight=False)


@train_app.command("cancel")
def cancel(
    job_id: str = JOB, url: str | None = URL, token: str | None = TOKEN, as_json: bool = AS_JSON
) -> None:
    """Cancel a job that has not ended; its node stops it."""
    job = TrainingJobView.model_validate(client(url, token).request("POST", f"{JOBS}/{job_id}/cancel"))
    if as_json:
        print_json(job)
    else:
        console.print(f"training job {job.id} {job.state}")


@train_app.command("publish")
def publish(
    job_id: str = JOB,
    name: str = typer.Option(..., "--name", help="The adapter's name, as clients ask for it."),
    owner: str | None = typer.Option(None, "--owner", help="Who owns the adapter; default: the job's owner."),
    url: str | None = URL,
    token: str | None = TOKEN,
    as_json: bool = AS_JSON,
) -> None:
    """Make a succeeded job's adapter an adapter of its model, after the architecture check."""
    body = {"name": name, "owner": owner}
    answer = client(url, token).request("POST", f"{JOBS}/{job_id}/publish", body)
    adapter = PublishedAdapter.model_validate(answer)
    if as_json:
        print_json(adapter)
    else:
        console.print(
            f"adapter {adapter.name} of {adapter.model} published, owned by {adapter.owner or 'the cluster'}"
        )
