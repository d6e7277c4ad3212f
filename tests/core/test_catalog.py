"""Model definitions: defaults, field-level problems, memory and replica counts."""

from __future__ import annotations

import string
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.core.catalog import parse_model
from llmgw.errors import ValidationFailed

SHA = "0123456789abcdef" * 4


def minimal(**fields: Any) -> dict[str, Any]:
    """The smallest valid definition, with ``fields`` laid over it."""
    return {"name": "smollm2", "source": {"sha256": SHA}, **fields}


def problems(data: Any) -> dict[str, str]:
    """The problems ``parse_model`` reports for ``data``, by field path."""
    with pytest.raises(ValidationFailed) as caught:
        parse_model(data)
    return dict(caught.value.problems)


def test_a_minimal_definition_gets_the_defaults() -> None:
    model = parse_model(minimal())

    assert (model.name, model.source.sha256) == ("smollm2", SHA)
    assert (model.source.format, model.source.filename, model.source.size) == ("gguf", "model.gguf", 0)
    assert (model.profile.engine, model.profile.memory_mb) == ("llama.cpp", None)
    assert (model.profile.ctx_size, model.profile.parallel) == (4096, 4)
    assert (model.profile.args, model.profile.env) == ((), {})
    assert (model.replicas.min, model.replicas.max) == (1, 1)
    assert (model.on_demand, model.idle_timeout_s, model.owner) == (False, 600, "")


def test_a_sha256_prefix_and_capitals_are_normalised() -> None:
    model = parse_model(minimal(source={"sha256": "sha256:" + SHA.upper()}))

    assert model.source.sha256 == SHA


@pytest.mark.parametrize(
    "sha256",
    ["", "abc", SHA[:-1], SHA + "0", "g" * 64, SHA + "\n", " " + SHA[1:]],
    ids=["empty", "short", "63-digits", "65-digits", "not-hex", "trailing-newline", "leading-space"],
)
def test_a_bad_sha256_is_named(sha256: str) -> None:
    assert "64 hexadecimal digits" in problems(minimal(source={"sha256": sha256}))["source.sha256"]


def test_a_missing_source_is_named_as_required() -> None:
    assert problems({"name": "smollm2"}) == {"source": "required"}


def test_min_replicas_above_max_is_named() -> None:
    found = problems(minimal(replicas={"min": 3, "max": 2}))

    assert found == {"replicas": "min (3) is larger than max (2)"}


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (minimal(colour="red"), "colour"),
        (minimal(source={"sha256": SHA, "url": "http://x"}), "source.url"),
        (minimal(profile={"gpu": 2}), "profile.gpu"),
        (minimal(profiles=[{}, {"gpu": 2}]), "profiles.1.gpu"),
        (minimal(replicas={"min": 1, "most": 2}), "replicas.most"),
    ],
    ids=["top-level", "source", "profile", "profiles", "replicas"],
)
def test_an_unknown_field_is_named_wherever_it_is(data: dict[str, Any], field: str) -> None:
    assert problems(data) == {field: "unknown field; remove it or check its spelling"}


def test_an_unknown_engine_is_named_with_the_known_ones() -> None:
    why = problems(minimal(profile={"engine": "vllm-nightly"}))["profile.engine"]

    assert "unknown engine 'vllm-nightly'" in why
    assert "llama.cpp" in why


@pytest.mark.parametrize(
    "name",
    ["", "-leading-dash", ".hidden", "has space", "semi;colon", "x" * 129, "trailing-newline\n"],
    ids=["empty", "leading-dash", "leading-dot", "space", "semicolon", "129-chars", "trailing-newline"],
)
def test_a_bad_name_is_named(name: str) -> None:
    assert "must start with a letter or digit" in problems(minimal(name=name))["name"]


@pytest.mark.parametrize("filename", ["weights/model.gguf", "../model.gguf", ".model.gguf", ""])
def test_a_filename_that_is_not_a_plain_name_is_named(filename: str) -> None:
    found = problems(minimal(source={"sha256": SHA, "filename": filename}))

    assert "plain file name" in found["source.filename"]


def test_every_bad_field_is_named_at_once() -> None:
    data = {
        "name": " bad",
        "source": {"sha256": "nope", "filename": "a/b"},
        "profile": {"engine": "nope"},
        "replicas": {"min": 2, "max": 1},
        "extra": True,
    }

    assert set(problems(data)) == {
        "name",
        "source.sha256",
        "source.filename",
        "profile.engine",
        "replicas",
        "extra",
    }


@pytest.mark.parametrize("data", [None, [], "name: x", 3])
def test_a_definition_that_is_not_a_mapping_is_refused(data: Any) -> None:
    assert problems(data) == {"": "a model definition must be a mapping of fields"}


def test_the_problems_appear_in_the_error_text_with_a_hint() -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse_model(minimal(replicas={"min": 3, "max": 2}))

    assert str(caught.value) == (
        "invalid input: replicas: min (3) is larger than max (2) (fix the fields named and try again)"
    )


def test_declared_memory_is_used_as_it_is() -> None:
    model = parse_model(minimal(source={"sha256": SHA, "size": 10 * 2**30}, profile={"memory_mb": 2048}))

    assert model.memory_needed_mb() == 2048


@pytest.mark.parametrize(
    ("size", "expected"),
    [(0, 256), (2**20, 257), (100 * 2**20, 381), (8 * 2**30, 10496)],
)
def test_undeclared_memory_is_estimated_from_the_weights(size: int, expected: int) -> None:
    model = parse_model(minimal(source={"sha256": SHA, "size": size}))

    assert model.memory_needed_mb() == expected


def test_a_vllm_replica_is_estimated_with_its_runtime_and_kv_cache() -> None:
    source = {"sha256": SHA, "size": 270 * 2**20, "format": "safetensors"}
    model = parse_model(minimal(source=source, profile={"engine": "vllm"}))

    assert model.memory_needed_mb() == int(270 * 1.25) + 3328  # SmolLM2-135M's vLLM CPU replica: ~3.5 GiB


@pytest.mark.parametrize(
    ("minimum", "demanded", "expected"),
    [(0, False, 0), (0, True, 1), (2, False, 2), (2, True, 2)],
)
def test_an_on_demand_model_wants_a_replica_while_in_use(minimum: int, demanded: bool, expected: int) -> None:
    model = parse_model(minimal(on_demand=True, replicas={"min": minimum, "max": 3}))

    assert model.wanted_replicas(demanded) == expected


@pytest.mark.parametrize("demanded", [False, True])
def test_a_model_that_is_not_on_demand_wants_its_minimum(demanded: bool) -> None:
    model = parse_model(minimal(replicas={"min": 0, "max": 3}))

    assert model.wanted_replicas(demanded) == 0


NAME_FIRST = string.ascii_letters + string.digits
NAME_REST = NAME_FIRST + "._:/-"
valid_names = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from(NAME_FIRST),
    st.text(alphabet=NAME_REST, max_size=127),
)


@given(valid_names)
def test_any_valid_name_round_trips(name: str) -> None:
    model = parse_model(minimal(name=name))

    assert model.name == name
    assert parse_model(model.model_dump()) == model


@given(valid_names, st.characters(exclude_characters=NAME_REST), st.integers(min_value=0, max_value=128))
def test_a_name_with_any_other_character_is_refused(name: str, odd: str, where: int) -> None:
    where = min(where, len(name))

    assert "name" in problems(minimal(name=name[:where] + odd + name[where:]))


@given(st.text(alphabet="0123456789abcdefABCDEF", min_size=64, max_size=64), st.booleans())
def test_any_sha256_is_kept_in_lower_case_without_prefix(digest: str, prefixed: bool) -> None:
    model = parse_model(minimal(source={"sha256": ("sha256:" if prefixed else "") + digest}))

    assert model.source.sha256 == digest.lower()


def test_a_mig_class_with_tp_above_one_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse_model(
            {
                "name": "m",
                "source": {"sha256": "a" * 64},
                "profile": {"engine": "vllm", "gpu_class": "a100-80g-mig-3g.40gb", "tp": 2},
            }
        )
    assert any(field == "profile" and "tp 2" in why for field, why in caught.value.problems)


def test_one_profile_reads_as_a_list_of_one() -> None:
    model = parse_model(minimal(profile={"ctx_size": 2048}))
    assert [p.ctx_size for p in model.profiles] == [2048]
    assert model.profile.ctx_size == 2048
    assert "profile" not in model.model_dump() and len(model.model_dump()["profiles"]) == 1


def test_profiles_keep_their_order() -> None:
    model = parse_model(minimal(profiles=[{"memory_mb": 20000}, {"memory_mb": 4000}]))
    assert [model.memory_needed_mb(p) for p in model.profiles] == [20000, 4000]


def test_profile_and_profiles_together_are_refused() -> None:
    found = problems(minimal(profile={}, profiles=[{}]))
    assert found == {"": "give either profile (one) or profiles (a list tried in order), not both"}


def test_an_empty_profile_list_is_refused() -> None:
    assert problems(minimal(profiles=[])) == {
        "profiles": "needs at least one profile; remove profiles to run on the defaults"
    }


VLLM = {"format": "safetensors", "filename": "model.safetensors"}


def test_gpus_times_nodes_must_equal_tp_times_pp() -> None:
    source = {"sha256": SHA, **VLLM}
    found = problems(minimal(source=source, profiles=[{"engine": "vllm", "tp": 2, "pp": 2, "gpus": 2}]))
    assert found == {
        "profiles.0": "gpus (2) x nodes (1) must equal tp x pp (4): set gpus to 4 or leave it unset"
    }
    uneven = problems(minimal(source=source, profile={"engine": "vllm", "tp": 3, "nodes": 2}))
    assert uneven == {
        "profile": "tp x pp (3) cards do not split evenly over 2 nodes; make tp x pp a multiple of nodes"
    }
    model = parse_model(minimal(source=source, profile={"engine": "vllm", "tp": 4, "pp": 2, "nodes": 2}))
    assert (model.profile.gpus_per_node, model.profile.spread.nodes) == (4, 2)


def test_pp_and_nodes_need_an_engine_that_spans_devices() -> None:
    why = "pp and nodes need engine vllm, sglang or trtllm; llama.cpp runs on one device"
    assert problems(minimal(profile={"pp": 2})) == {"profile": why}
    assert problems(minimal(profiles=[{}, {"nodes": 2}])) == {"profiles.1": why}


def test_replicas_take_the_scaling_settings() -> None:
    replicas = {
        "min": 1,
        "max": 3,
        "ttft_target_ms": 800,
        "scale_up_cooldown_s": 10,
        "scale_down_cooldown_s": 90,
    }
    model = parse_model(minimal(replicas=replicas, priority=3))
    assert (model.replicas.ttft_target_ms, model.replicas.scale_down_cooldown_s, model.priority) == (
        800,
        90,
        3,
    )
    assert model.replicas.drain_timeout_s == 60


def test_profiles_of_one_model_must_serve_the_same_task() -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse_model(
            {
                "name": "mixed",
                "source": {"sha256": "a" * 64},
                "profiles": [{"serves": "chat"}, {"serves": "embeddings"}],
            }
        )
    assert "serves the same thing" in str(caught.value)
