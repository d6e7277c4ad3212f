"""The catalog's engine rules follow each engine's row of capabilities, for every row there is."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.core.catalog import parse_model
from llmgw.core.engines import (
    DEFAULT_ENGINE,
    ENGINE_NAMES,
    ENGINES,
    AdapterShape,
    EngineCapabilities,
    Managed,
    WeightsFormat,
    default_engine_for,
    either,
    engine_capabilities,
    find_engine,
)
from llmgw.core.validation import check_args, check_env
from llmgw.errors import ConfigError, ValidationFailed

SHA = "0123456789abcdef" * 4
OTHER = "fedcba9876543210" * 4
ROWS = pytest.mark.parametrize("row", ENGINES, ids=ENGINE_NAMES)


def definition(row: EngineCapabilities, *adapters: dict[str, Any], **profile: Any) -> dict[str, Any]:
    return {
        "name": "base",
        "source": {"sha256": SHA, "format": row.weights_format.value},
        "profile": {"engine": row.name, **profile},
        "adapters": list(adapters),
    }


def adapter(row: EngineCapabilities, **fields: Any) -> dict[str, Any]:
    """An adapter of the shape ``row`` takes."""
    extra = {"files": [{"sha256": OTHER, "filename": "adapter_config.json"}]}
    return {
        "name": "a",
        "sha256": SHA,
        **(extra if row.adapter_shape is AdapterShape.PEFT_FOLDER else {}),
        **fields,
    }


def refusals(data: dict[str, Any]) -> dict[str, str]:
    try:
        parse_model(data)
    except ValidationFailed as error:
        return dict(error.problems)
    return {}


@ROWS
def test_a_model_runs_only_the_weights_format_its_engine_runs(row: EngineCapabilities) -> None:
    assert refusals(definition(row)) == {}
    for other in WeightsFormat:
        if other is not row.weights_format:
            data = definition(row)
            data["source"]["format"] = other.value
            why = refusals(data)[""]
            assert f"runs {row.weights_format.label} weights" in why
            assert default_engine_for(other) in why


@ROWS
def test_kv_events_are_allowed_exactly_where_the_engine_publishes_them(row: EngineCapabilities) -> None:
    found = refusals(definition(row, kv_events=True))
    assert (found == {}) is row.kv_events
    if not row.kv_events:
        assert "kv_events needs engine" in found["profile"]


@ROWS
def test_tp_above_one_is_allowed_exactly_where_the_engine_splits_by_tensor(row: EngineCapabilities) -> None:
    found = refusals(definition(row, tp=2))
    assert (found == {}) is row.tensor_parallel
    if not row.tensor_parallel:
        wanted = either(r.name for r in ENGINES if r.tensor_parallel)
        assert f"tp needs engine {wanted}" in found["profile"]


@ROWS
def test_runtime_adapter_slots_are_allowed_exactly_where_the_engine_loads_at_run_time(
    row: EngineCapabilities,
) -> None:
    found = refusals(definition(row, max_loaded_adapters=2))
    assert (found == {}) is row.runtime_adapters


@ROWS
def test_adapters_are_refused_where_the_engine_serves_none(row: EngineCapabilities) -> None:
    found = refusals(definition(row, adapter(row)))
    assert (found == {}) is row.serves_adapters
    if not row.serves_adapters:
        assert "serves no LoRA adapters" in found["adapters.0"]


@ROWS
def test_an_adapter_without_a_file_name_gets_its_shapes(row: EngineCapabilities) -> None:
    if not row.serves_adapters:
        pytest.skip("the engine serves no adapters")
    model = parse_model(definition(row, adapter(row)))
    assert model.adapters[0].weights_filename(row.name) == row.adapter_shape.weights_filename


@ROWS
def test_scale_and_rank_are_taken_exactly_where_the_engine_uses_them(row: EngineCapabilities) -> None:
    if not row.serves_adapters:
        pytest.skip("the engine serves no adapters")
    found = refusals(definition(row, adapter(row, scale=0.5, rank=8)))
    assert ("adapters.0.scale" not in found) is row.adapter_scale
    assert ("adapters.0.rank" not in found) is bool(row.adapter_ranks)


@ROWS
def test_a_file_name_holding_a_character_the_engine_splits_at_is_refused(row: EngineCapabilities) -> None:
    if not row.adapter_filename_refuses:
        pytest.skip("the engine splits no adapter list")
    suffix = row.adapter_shape.suffixes[0]
    for char in row.adapter_filename_refuses:
        found = refusals(definition(row, adapter(row, filename=f"a{char}b{suffix}")))
        assert "rename the file" in found["adapters.0.filename"]


@ROWS
def test_every_flag_llmgw_sets_is_refused_in_args(row: EngineCapabilities) -> None:
    for flag in row.own_flags:
        (refusal,) = check_args(row.name, [flag, "1"])
        assert "llmgw sets it" in refusal.why


@ROWS
def test_every_flag_of_what_llmgw_manages_is_refused_saying_what_to_set(row: EngineCapabilities) -> None:
    for flag, setting in row.managed_flags:
        (refusal,) = check_args(row.name, [flag, "1"])
        assert refusal.why.startswith("llmgw ")
        assert refusal.why == setting.why or (setting is Managed.KV_EVENTS and not row.kv_events)
        assert "; set " in refusal.why or refusal.why.endswith(("; remove it", "are routed)"))


@ROWS
def test_flag_setting_variables_are_read_only_by_their_engine(row: EngineCapabilities) -> None:
    for setter in (r for r in ENGINES if r.flag_env_prefix):
        variable = f"{setter.flag_env_prefix}N_GPU_LAYERS"
        found = check_env(row.name, {variable: "10"})
        assert (found == []) is (setter is row)


@ROWS
def test_the_engines_own_tuning_families_pass_and_the_agents_variables_do_not(
    row: EngineCapabilities,
) -> None:
    for family in row.env_families:
        if family != row.flag_env_prefix:
            assert check_env(row.name, {f"{family}SOME_TUNING": "1"}) == []
    for variable in row.agent_env:
        assert "llmgw sets it itself" in check_env(row.name, {variable: "1"})[0].why


def test_a_profile_without_an_engine_runs_the_default_engine_and_its_format() -> None:
    model = parse_model({"name": "m", "source": {"sha256": SHA}})
    assert model.profile.engine == DEFAULT_ENGINE
    assert model.profile.capabilities is find_engine("")
    assert default_engine_for(model.source.format) == DEFAULT_ENGINE


def test_an_unknown_engine_is_a_config_error_naming_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown engine 'tgi'") as caught:
        engine_capabilities("tgi")
    assert all(name in caught.value.hint for name in ENGINE_NAMES)
    assert find_engine("tgi") is None


def test_the_largest_rank_setting_rounds_up_and_stops_at_the_largest() -> None:
    row = next(r for r in ENGINES if r.adapter_ranks)
    assert row.max_lora_rank(row.adapter_ranks[0] + 1) == row.adapter_ranks[1]
    assert row.max_lora_rank(10**6) == row.adapter_ranks[-1]
    without = next(r for r in ENGINES if r.serves_adapters and not r.adapter_ranks)
    with pytest.raises(ValueError, match="reads ranks from the adapter files"):
        without.max_lora_rank(8)


def test_either_joins_names_for_a_message() -> None:
    assert [either([]), either(["a"]), either(["a", "b"]), either(["a", "b", "c"])] == [
        "",
        "a",
        "a or b",
        "a, b or c",
    ]
