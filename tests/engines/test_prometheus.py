"""The one Prometheus text parser: labels holding any text, non-finite values, timestamps, bad bytes."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.engines import sglang, vllm
from llmgw.engines.engine import COUNT_LIMIT, parse_load
from llmgw.engines.prometheus import MetricsTextError, Sample, parse, values_by_name
from llmgw.errors import EngineUnhealthy

NAMES = st.from_regex(r"[A-Za-z_:][A-Za-z0-9_:]{0,20}", fullmatch=True)
LABEL_NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)
VALUES = st.floats(allow_nan=True, allow_infinity=True)
TIMESTAMPS = st.none() | st.integers(min_value=-(2**62), max_value=2**62)


def escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def written(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def line_of(sample: Sample, trailing_comma: bool) -> str:
    labels = ",".join(f'{key}="{escaped(value)}"' for key, value in sample.labels)
    if sample.labels and trailing_comma:
        labels += ","
    text = sample.name + (f"{{{labels}}}" if sample.labels or trailing_comma else "")
    text += f" {written(sample.value)}"
    return text + (f" {sample.timestamp_ms}" if sample.timestamp_ms is not None else "")


SAMPLES = st.builds(
    Sample,
    name=NAMES,
    labels=st.lists(st.tuples(LABEL_NAMES, st.text(max_size=30)), max_size=4).map(tuple),
    value=VALUES,
    timestamp_ms=TIMESTAMPS,
)


def same(a: Sample, b: Sample) -> bool:
    values_agree = (math.isnan(a.value) and math.isnan(b.value)) or a.value == b.value
    return values_agree and (a.name, a.labels, a.timestamp_ms) == (b.name, b.labels, b.timestamp_ms)


@given(
    st.lists(st.tuples(SAMPLES, st.booleans(), st.sampled_from(["", "# HELP x y", "# TYPE x gauge", "  "])))
)
def test_every_written_sample_reads_back_as_written(rows: list[tuple[Sample, bool, str]]) -> None:
    lines = []
    for sample, comma, extra in rows:
        lines += [extra, line_of(sample, comma)]
    got = parse("\n".join(lines) + "\n")
    assert len(got) == len(rows)
    assert all(same(a, b) for a, b in zip(got, (s for s, _, _ in rows), strict=True))


@given(st.text())
def test_any_text_reads_as_samples_or_a_named_line(text: str) -> None:
    try:
        parse(text)
    except MetricsTextError as error:
        assert str(error).startswith("line ")


@given(st.binary())
def test_any_bytes_read_as_samples_or_a_named_line(data: bytes) -> None:
    try:
        parse(data)
    except MetricsTextError as error:
        assert str(error).startswith("line ")


def test_a_closing_brace_inside_a_label_value_is_part_of_the_value() -> None:
    (sample,) = parse('vllm:num_requests_running{model_name="a} 5 \\"x\\", y=\\"z\\"",engine="0"} 3\n')
    assert sample.value == 3.0
    assert sample.labels == (("model_name", 'a} 5 "x", y="z"'), ("engine", "0"))


def test_a_brace_in_a_label_no_longer_changes_the_load_read() -> None:
    text = (
        'vllm:num_requests_running{model_name="q} 9 "} 3\nvllm:num_requests_waiting{model_name="q} 9 "} 1\n'
    )
    load = parse_load(text, vllm.ENGINE.metrics, "vllm")
    assert (load.running, load.waiting) == (3, 1)


def test_infinities_and_nan_are_floats_in_any_case() -> None:
    values = [s.value for s in parse("a +Inf\nb -Inf\nc NaN\nd inf\ne nan\n")]
    assert values[:2] == [math.inf, -math.inf] and math.isnan(values[2])
    assert values[3] == math.inf and math.isnan(values[4])


def test_a_timestamp_is_kept_in_milliseconds() -> None:
    (sample,) = parse('requests_total{a="b"} 12 1700000000123\n')
    assert (sample.value, sample.timestamp_ms) == (12.0, 1700000000123)


def test_comments_blank_lines_and_crlf_are_skipped() -> None:
    text = "# HELP a A.\r\n# TYPE a gauge\r\n\r\n  a 1\r\n# EOF\r\n"
    assert values_by_name(parse(text)) == {"a": [1.0]}


def test_ranks_reporting_one_count_are_read_once_and_shares_beside_a_total_left_out() -> None:
    text = (
        'q{dp="0",pp="0"} 5\nq{dp="0",pp="1"} 4\nq{dp="1",pp="0"} 2\n'
        'q{dp="0",pp="0",priority="3"} 1\nq{dp="0",pp="0",priority=""} 7\nother{pp="1"} 3\n'
    )
    assert values_by_name(parse(text)) == {"q": [5.0, 4.0, 2.0, 1.0, 7.0], "other": [3.0]}
    once = values_by_name(parse(text), ranks={"pp"}, shares={"priority"})
    assert once == {"q": [5.0, 2.0, 7.0], "other": [3.0]}


@pytest.mark.parametrize("text", ['g{pp="0"} NaN\ng{pp="1"} 1\n', 'g{pp="0"} 1\ng{pp="1"} NaN\n'])
def test_a_rank_reporting_nan_is_not_hidden_by_another(text: str) -> None:
    [value] = values_by_name(parse(text), ranks={"pp"})["g"]
    assert math.isnan(value)


def test_bytes_that_are_not_utf8_read_as_replacement_characters() -> None:
    (sample,) = parse(b'a{model="q\xff\xfe"} 2\n')
    assert sample.label("model") == "q\ufffd\ufffd" and sample.value == 2.0


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('a{b="c" 1', "labels end with '}'"),
        ('a{b="c} 1', 'name="value" pairs'),
        ("a 1_000", "not a number"),
        ("a one", "not a number"),
        ("a 1 2.5", "not an integer"),
        ("a 1 2 3", "at most a timestamp"),
        ('a{b="c"}1', "a blank must separate"),
        ('{b="c"} 1', "metric name"),
    ],
)
def test_a_line_outside_the_format_is_named_with_its_number(line: str, why: str) -> None:
    with pytest.raises(MetricsTextError, match=why) as caught:
        parse(f"# TYPE a gauge\n{line}\n")
    assert caught.value.line_number == 2


@pytest.mark.parametrize("value", ["+Inf", "-Inf", "NaN", "-1", "1e300"])
def test_a_count_that_is_no_count_fails_the_reading_naming_it(value: str) -> None:
    text = f"vllm:num_requests_running {value}\nvllm:num_requests_waiting 0\n"
    with pytest.raises(EngineUnhealthy, match="vllm:num_requests_running"):
        parse_load(text, vllm.ENGINE.metrics, "vllm")


@pytest.mark.parametrize("value", ["+Inf", "NaN", "-0.5"])
def test_a_kv_share_that_is_no_share_fails_the_reading(value: str) -> None:
    text = f"sglang:num_running_reqs 1\nsglang:num_queue_reqs 0\nsglang:token_usage {value}\n"
    with pytest.raises(EngineUnhealthy, match="sglang:token_usage"):
        parse_load(text, sglang.ENGINE.metrics, "sglang")


def test_text_outside_the_format_fails_the_reading_with_the_line() -> None:
    with pytest.raises(EngineUnhealthy, match="not Prometheus text: line 2"):
        parse_load("vllm:num_requests_running 1\n<html>\n", vllm.ENGINE.metrics, "vllm")


@given(st.lists(VALUES, min_size=1, max_size=3), VALUES)
def test_any_values_give_a_load_or_a_failed_reading(running: list[float], share: float) -> None:
    """Counts and share that are numbers give exactly that load; otherwise the reading fails naming
    the first gauge that is not (a count: finite, 0 to 2**53, summed too; a share: finite, >= 0)."""
    text = "".join(f'vllm:num_requests_running{{r="{i}"}} {written(v)}\n' for i, v in enumerate(running))
    text += f"vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc {written(share)}\n"
    counts = all(math.isfinite(v) and 0 <= v <= COUNT_LIMIT for v in running)
    counts = counts and math.fsum(running) <= COUNT_LIMIT
    a_share = math.isfinite(share) and share >= 0
    if counts and a_share:
        load = parse_load(text, vllm.ENGINE.metrics, "vllm")
        assert load.running == int(math.fsum(running)) and load.waiting == 0
        assert load.kv_cache_usage == share * vllm.ENGINE.metrics.kv_scale and load.queue_reported
        return
    wrong = "vllm:num_requests_running" if not counts else "vllm:kv_cache_usage_perc"
    with pytest.raises(EngineUnhealthy) as refused:
        parse_load(text, vllm.ENGINE.metrics, "vllm")
    assert f"vllm reports {wrong} = " in refused.value.message


def test_counts_whose_sum_would_overflow_fail_the_reading_instead_of_raising() -> None:
    text = 'vllm:num_requests_running{a="1"} 1.7e308\nvllm:num_requests_running{a="2"} 1.7e308\n'
    with pytest.raises(EngineUnhealthy, match="which is not a count"):
        parse_load(text + "vllm:num_requests_waiting 0\n", vllm.ENGINE.metrics, "vllm")
