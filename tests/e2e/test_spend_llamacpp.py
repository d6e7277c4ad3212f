"""Spend in money on real llama-server with SmolLM2: a price set on the model and a small money
budget on a project; requests (chat, streamed chat, the Messages API) are priced from their tokens,
the project is refused 429 budget_exceeded once the budget is spent, and /api/usage's cost is what
the client's counted tokens come to at the price."""

from __future__ import annotations

import anthropic
import openai
import pytest

from llmgw.adminapi.usage import UsageLine
from llmgw.cli.up import DEFAULT_MODEL
from llmgw.testing.cluster import Cluster, wait_for

pytestmark = pytest.mark.e2e

CHAT = "project:acme/ml/chat"
INPUT, OUTPUT = 1_000.0, 2_000.0
"""Per million tokens: dear, so that a few short answers spend the budget."""
BUDGET = 0.2
ASK: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]


def test_a_project_spends_its_money_budget_and_usage_costs_what_its_tokens_do(cluster: Cluster) -> None:
    admin = cluster.admin
    admin.create_unit("orgs", {"name": "acme"})
    admin.create_unit("teams", {"org": "acme", "name": "ml"})
    admin.create_unit("projects", {"org": "acme", "team": "ml", "name": "chat"})
    key = admin.create_key("spend", place=CHAT).key
    assert (
        admin.set_setting(f"pricing.models.{DEFAULT_MODEL}", {"input": INPUT, "output": OUTPUT}).warnings
        == []
    )
    admin.set_limits(CHAT, {"usd_per_day": BUDGET})

    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=key, max_retries=0, timeout=120)
    counted: list[tuple[int, int]] = []
    """(prompt, completion) tokens of each answer, as the client was told them."""
    whole = client.chat.completions.create(model=DEFAULT_MODEL, messages=ASK, max_tokens=8)
    assert whole.usage is not None
    counted.append((whole.usage.prompt_tokens, whole.usage.completion_tokens))
    chunks = list(
        client.chat.completions.create(
            model=DEFAULT_MODEL,
            messages=ASK,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = chunks[-1].usage
    assert usage is not None
    counted.append((usage.prompt_tokens, usage.completion_tokens))
    with anthropic.Anthropic(base_url=cluster.url, api_key=key, max_retries=0, timeout=120) as sdk:
        message = sdk.messages.create(model=DEFAULT_MODEL, max_tokens=8, messages=ASK)  # type: ignore[arg-type]
    read = message.usage.cache_read_input_tokens or 0  # Anthropic's usage counts the cached prompt apart
    counted.append((message.usage.input_tokens + read, message.usage.output_tokens))

    refusal = None
    for _ in range(40):
        try:
            answer = client.chat.completions.create(model=DEFAULT_MODEL, messages=ASK, max_tokens=8)
        except openai.RateLimitError as error:
            refusal = error
            break
        assert answer.usage is not None
        counted.append((answer.usage.prompt_tokens, answer.usage.completion_tokens))
    assert refusal is not None, "the budget was never spent"
    spent = sum(p * INPUT + c * OUTPUT for p, c in counted) / 1_000_000
    assert spent >= BUDGET  # refused only once spent ...
    last = counted[-1][0] * INPUT + counted[-1][1] * OUTPUT
    assert spent - last / 1_000_000 < BUDGET  # ... and not before (the last one was admitted under it)
    assert refusal.status_code == 429 and refusal.code == "budget_exceeded"
    assert f"spent {spent:.6f} USD this day, its budget is {BUDGET:g} USD" in refusal.message
    assert "resets at" in refusal.message and int(refusal.response.headers["retry-after"]) >= 1

    def priced() -> UsageLine | None:
        lines = admin.usage([("group_by", "project"), ("group_by", "model")]).lines
        line = next((line for line in lines if line.project == CHAT and line.model == DEFAULT_MODEL), None)
        return line if line is not None and line.requests == len(counted) + 1 else None

    line = wait_for(priced, 30, "every request, the refused one too, is in /api/usage")
    assert (line.prompt_tokens, line.completion_tokens) == tuple(map(sum, zip(*counted, strict=True)))
    assert line.cost == pytest.approx(spent, rel=1e-6)
    assert line.cached_tokens <= line.prompt_tokens
    answer = admin.usage([("group_by", "project")])
    assert answer.currency == "USD" and answer.totals.cost == pytest.approx(spent, rel=1e-6)
