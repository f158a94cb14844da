"""Trace readers on the committed excerpts and on generated files: formats, gaps, scaling, errors."""

from __future__ import annotations

import numpy as np
import pytest
from preheat.sim.traces import RequestTrace, SeriesTrace, TraceError, load_cold_start, load_trace

from .tracegen import write_requests, write_series


def test_azure_excerpt_datetimes_and_tokens(data_dir):
    tr = load_trace(data_dir / "azure_llm_2023_code_excerpt.csv")
    assert isinstance(tr, RequestTrace) and tr.has_tokens
    assert len(tr.arrival_s) == 700
    assert tr.arrival_s[0] == 0.0 and np.all(np.diff(tr.arrival_s) >= 0)
    # the excerpt's first row is 2023-11-16 18:17:03.97996, its second 0.052 s later
    assert tr.arrival_s[1] == pytest.approx(0.052, abs=1e-6)
    assert tr.input_tokens[0] == 4808 and tr.output_tokens[0] == 10
    assert "datetime" in tr.source_format


def test_mooncake_excerpt_milliseconds(data_dir):
    tr = load_trace(data_dir / "mooncake_conversation_excerpt.jsonl")
    assert isinstance(tr, RequestTrace) and len(tr.arrival_s) == 300
    assert tr.duration_s == pytest.approx(102.0)  # last timestamp 102000 ms
    assert tr.input_tokens[0] == 6758 and tr.output_tokens[0] == 500


def test_plain_csv_seconds(tmp_path):
    tr = load_trace(write_requests(tmp_path / "t.csv", np.array([5.0, 1.0, 3.0])))
    assert list(tr.arrival_s) == [0.0, 2.0, 4.0]  # sorted, shifted to start at 0
    assert tr.source_format == "csv (timestamp s)"


def test_series_zero_windows_are_missing(data_dir):
    tr = load_trace(data_dir / "servegen_m-mid_2days.csv")
    assert isinstance(tr, SeriesTrace) and tr.window_s == 600
    assert tr.missing_windows == 11  # the excerpt's all-zero windows: a logging gap, not zero traffic
    assert np.nanmin(tr.rate_rps) > 0


def test_series_zero_kept_when_traffic_is_small(tmp_path):
    # a quiet series (a few requests per window) can really be empty: zero stays zero
    tr = load_trace(write_series(tmp_path / "s.csv", [0.01, 0.0, 0.02, 0.01]))
    assert tr.missing_windows == 0 and tr.rate_rps[1] == 0.0


def test_series_rows_absent_from_the_log_are_missing_windows(tmp_path):
    """A row the log lacks is a gap of whole windows: missing data, in place, not a changed window."""
    p = tmp_path / "gaps.csv"
    p.write_text("t_s,total_rate_rps,rate_weighted_cv\n0,1.0,1.2\n60,2.0,1.1\n240,3.0,1.3\n300,0.5,\n")
    tr = load_trace(p)
    assert isinstance(tr, SeriesTrace) and tr.window_s == 60 and tr.missing_windows == 2
    assert list(tr.t_s) == [0.0, 60.0, 120.0, 180.0, 240.0, 300.0]
    np.testing.assert_array_equal(tr.rate_rps, [1.0, 2.0, np.nan, np.nan, 3.0, 0.5])
    np.testing.assert_array_equal(tr.cv, [1.2, 1.1, np.nan, np.nan, 1.3, np.nan])
    # requests counted per window instead of a rate
    p.write_text("t_s,requests\n0,60\n60,120\n120,30\n240,90\n")
    counted = load_trace(p)
    np.testing.assert_array_equal(counted.rate_rps, [1.0, 2.0, 0.5, np.nan, 1.5])
    # a step that is not a whole number of the typical window is not a gap: the series says why
    p.write_text("t_s,total_rate_rps\n0,1\n600,2\n900,3\n")
    with pytest.raises(TraceError, match="whole multiples"):
        load_trace(p)


def test_rate_scale(data_dir, tmp_path):
    base = load_trace(data_dir / "mooncake_conversation_excerpt.jsonl")
    double = load_trace(data_dir / "mooncake_conversation_excerpt.jsonl", rate_scale=2.0)
    half = load_trace(data_dir / "mooncake_conversation_excerpt.jsonl", rate_scale=0.5, seed=1)
    assert len(double.arrival_s) == 2 * len(base.arrival_s)
    assert 100 < len(half.arrival_s) < 200
    assert double.duration_s == pytest.approx(base.duration_s)  # same time shape, more load
    series = load_trace(data_dir / "servegen_m-mid_2days.csv", rate_scale=0.01)
    raw = load_trace(data_dir / "servegen_m-mid_2days.csv")
    assert np.nanmax(series.rate_rps) == pytest.approx(0.01 * np.nanmax(raw.rate_rps))


def _load(tmp_path, name: str, text: str) -> RequestTrace:
    p = tmp_path / name
    p.write_text(text)
    tr = load_trace(p)
    assert isinstance(tr, RequestTrace)
    return tr


def test_unix_time_is_read_in_the_unit_that_makes_it_unix_time(tmp_path):
    """Relative timestamps keep the format's unit (CSV seconds, JSONL ms); absolute ones are Unix time in
    s, ms, us or ns, whichever puts them between 2001 and 5138."""
    epoch_ms = _load(tmp_path, "ms.csv", "timestamp\n1700000000123\n1700000001123\n1700000005623\n")
    assert list(epoch_ms.arrival_s) == pytest.approx([0.0, 1.0, 5.5]) and epoch_ms.source_format == "csv (timestamp ms)"
    epoch_us = _load(tmp_path, "us.csv", "timestamp\n1700000000000000\n1700000002500000\n")
    assert list(epoch_us.arrival_s) == pytest.approx([0.0, 2.5])
    epoch_s = _load(tmp_path, "s.jsonl", '{"timestamp": 1700000000.5}\n{"timestamp": 1700000003.0}\n')
    assert list(epoch_s.arrival_s) == pytest.approx([0.0, 2.5]) and epoch_s.source_format == "jsonl (timestamp s)"
    relative = _load(tmp_path, "rel.jsonl", '{"timestamp": 0}\n{"timestamp": 2500}\n')
    assert list(relative.arrival_s) == [0.0, 2.5]  # Mooncake's milliseconds from the start
    # a column named for its unit says it outright
    named = _load(tmp_path, "named.csv", "timestamp_ms,input_tokens,output_tokens\n0,1,1\n2500,1,1\n")
    assert list(named.arrival_s) == [0.0, 2.5]
    assert list(_load(tmp_path, "named.jsonl", '{"timestamp_s": 0}\n{"timestamp_s": 2.5}\n').arrival_s) == [0.0, 2.5]


def test_burstgpt_columns_and_datetimes_with_utc_offsets(tmp_path):
    burst = _load(tmp_path, "b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                  "5,ChatGPT,472,18,490,Conversation log\n45,GPT-4,1087,0,1087,Conversation log\n")
    assert burst.has_tokens and list(burst.input_tokens) == [472, 1087] and list(burst.output_tokens) == [18, 0]
    assert list(burst.arrival_s) == [0.0, 40.0]
    # the same instants written in two zones; a naive datetime beside an offset one is ambiguous
    zoned = _load(tmp_path, "z.csv", "timestamp\n2024-05-10T00:00:01Z\n2024-05-10T08:00:00+08:00\n"
                  "2024-05-09T17:00:03.5-07:00\n")
    assert list(zoned.arrival_s) == pytest.approx([0.0, 1.0, 3.5])
    with pytest.raises(TraceError, match="UTC offset and some do not"):
        _load(tmp_path, "mixed.csv", "timestamp\n2024-05-10T00:00:01Z\n2024-05-10T00:00:02\n")
    with pytest.raises(TraceError, match="neither numbers nor datetimes"):
        _load(tmp_path, "junk.csv", "timestamp\nyesterday+1\n")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("a,b\n1,2\n", "unrecognised CSV header"),
        ("timestamp,input_tokens,output_tokens\n", "no requests"),
        ("timestamp,input_tokens,output_tokens\n1,-5,3\n", "negative"),
        ("t_s,total_rate_rps\n0,1\n600,2\n900,3\n", "constant window"),
        ('{"timestamp": 1}\n{"foo": 2}\n', "timestamp"),
        ("", "empty"),
    ],
)
def test_bad_traces_say_why(tmp_path, content, message):
    p = tmp_path / "bad.csv"
    p.write_text(content)
    with pytest.raises(TraceError, match=message):
        load_trace(p)


def test_missing_file_and_bad_scale(tmp_path):
    with pytest.raises(TraceError, match="not found"):
        load_trace(tmp_path / "nope.csv")
    with pytest.raises(TraceError, match="rate-scale"):
        load_trace(write_requests(tmp_path / "t.csv", np.array([0.0, 1.0])), rate_scale=0)


def test_cold_start_number_and_files(tmp_path):
    assert load_cold_start("30").samples_s.tolist() == [30.0]
    (tmp_path / "ms.csv").write_text("cold_start_ms\n1000\n3000\n")
    (tmp_path / "s.csv").write_text("cold_start_s\n2\n4\n")
    assert load_cold_start(str(tmp_path / "ms.csv")).samples_s.tolist() == [1.0, 3.0]
    assert load_cold_start(str(tmp_path / "s.csv")).samples_s.tolist() == [2.0, 4.0]
    (tmp_path / "bad.csv").write_text("latency\n1\n")
    with pytest.raises(TraceError, match="cold_start_ms"):
        load_cold_start(str(tmp_path / "bad.csv"))
    with pytest.raises(TraceError, match="neither a number nor an existing file"):
        load_cold_start("thirty")
    with pytest.raises(TraceError, match="non-negative"):
        load_cold_start("-1")


def test_gzip_traces_and_cold_starts_read_as_their_text_and_a_damaged_one_says_why(tmp_path, data_dir):
    """A gzip file is recognised by its bytes, whatever its name: the same trace as the plain file."""
    import gzip

    for name in ("mooncake_conversation_excerpt.jsonl", "azure_llm_2023_code_excerpt.csv", "servegen_m-mid_2days.csv"):
        plain = data_dir / name
        packed = tmp_path / (name + ".gz")
        packed.write_bytes(gzip.compress(plain.read_bytes()))
        a, b = load_trace(plain), load_trace(packed)
        assert type(b) is type(a) and b.source_format == a.source_format
        times = ("t_s", "rate_rps") if isinstance(a, SeriesTrace) else ("arrival_s",)
        for k in times:
            assert len(getattr(a, k)) > 0 and np.array_equal(getattr(b, k), getattr(a, k), equal_nan=True)
    unnamed = tmp_path / "cold.csv"  # gzip without the .gz name
    unnamed.write_bytes(gzip.compress(b"cold_start_s\n2\n4\n"))
    assert load_cold_start(str(unnamed)).samples_s.tolist() == [2.0, 4.0]
    damaged = tmp_path / "cut.csv.gz"
    damaged.write_bytes(gzip.compress(b"timestamp\n1\n2\n" * 50)[:30])
    with pytest.raises(TraceError, match="damaged gzip"):
        load_trace(damaged)
    with pytest.raises(TraceError, match="damaged gzip"):
        load_cold_start(str(damaged))


def test_cold_start_sampler_is_seeded_and_peek_matches_draw(tmp_path):
    (tmp_path / "ms.csv").write_text("cold_start_ms\n" + "\n".join(str(i * 1000) for i in range(1, 50)) + "\n")
    model = load_cold_start(str(tmp_path / "ms.csv"))
    a, b = model.sampler(3), model.sampler(3)
    seq_a = [a.draw() for _ in range(10)]
    assert seq_a == [b.draw() for _ in range(10)]
    c = model.sampler(3)
    assert c.peek() == c.draw() == seq_a[0]  # the oracle's foresight is the real next cold start
