"""The routing benchmark's pieces for real vLLM: the best hit rate over the engine's tokens, the cache's
size, the one-token words and the primes (nothing here starts vLLM)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

_FOLDER = Path(__file__).resolve().parents[2] / "bench" / "routing"


def _load(name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(name, _FOLDER / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


real_vllm = _load("real_vllm")
run = _load("run")


def test_the_best_hit_rate_counts_full_blocks_seen_before_in_a_chain_from_the_start() -> None:
    shared = list(range(8))
    prompts = [[*shared, 100, 101, 102], [*shared, 200, 201, 202], [9, *shared[1:], 300, 301, 302]]
    # Blocks of 4: the second prompt hits both of the first's shared blocks; the third, whose first
    # token differs, hits nothing although its second block's tokens were seen.
    assert real_vllm.best_hit_rate(prompts, 4) == 8 / 33


def test_the_best_hit_rate_never_counts_the_block_holding_the_prompts_last_token() -> None:
    prompt = list(range(8))
    # vLLM always computes the last token: of two 4-token blocks only the first can be a hit.
    assert real_vllm.best_hit_rate([prompt, prompt], 4) == 4 / 16


def test_the_best_hit_rate_leaves_the_primes_out_but_counts_their_blocks_as_seen() -> None:
    system = list(range(8))
    prompts = [[*system, 1], [*system, 2], [*system, 3]]
    assert real_vllm.best_hit_rate(prompts, 4, primed=1) == 16 / 18


def test_the_cache_is_sized_so_the_hot_prefixes_fill_their_share_of_all_replicas() -> None:
    # Four 384-token prompts are 12 blocks of 128; at 70 % over two replicas: 9 blocks each.
    assert real_vllm.cache_blocks([384] * 4, 128, 0.7, 2, ctx_size=512) == 9


def test_the_cache_never_holds_less_than_vllm_starts_with() -> None:
    # One sequence of max-model-len tokens, and the null block vLLM's pool keeps back.
    assert real_vllm.cache_blocks([128], 128, 0.7, 2, ctx_size=2048) == 17


def test_the_hot_blocks_are_each_groups_common_full_blocks() -> None:
    prompts = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 7], [8, 9, 1, 2, 3, 4]]
    assert real_vllm.shared_blocks(prompts, [0, 0, 1], 2) == 2 + 3


def test_the_workload_words_are_the_tokenizers_one_token_words_after_a_space() -> None:
    vocab = {"Ġthe": 5, "the": 1, "Ġand": 3, "Ġx": 2, "ĠThe": 4, "Ġcat": 9}
    text = json.dumps({"model": {"vocab": vocab}})
    assert real_vllm.vocabulary_words(text, count=3) == ["and", "the", "cat"]


def test_the_primes_are_each_groups_first_request_and_every_users_turns_stay_in_order() -> None:
    work = run.Workload(groups=3, users=2, turns=3, system_tokens=20, message_tokens=4, max_tokens=2, seed=3)
    work.build()
    before = list(work.requests)
    work.prime_groups()
    assert work.primes == 3
    assert sorted(user // 2 for user, _ in work.requests[:3]) == [0, 1, 2]
    assert sorted(work.requests) == sorted(before)
    for user in range(6):
        turns = [prompt for u, prompt in work.requests if u == user]
        assert turns == sorted(turns, key=len)


def test_the_load_phases_last_about_their_requests_over_each_rate() -> None:
    assert real_vllm.workload_minutes(30, [0.5, 1.5], policies=4, drain_s=15) == 4 * (60 + 15 + 20 + 15) / 60
