"""Trace readers: turn a request log or a per-window count series into arrays the simulator replays.

Formats are auto-detected from the file itself (never from its name alone), gzip-compressed or not:

* per-request CSV with a `timestamp` column: Azure LLM inference traces (`TIMESTAMP` as datetime
  strings, `ContextTokens`, `GeneratedTokens`), BurstGPT (`Timestamp` in seconds, `Request tokens`,
  `Response tokens`) or a plain `timestamp,input_tokens,output_tokens` file with timestamps in seconds;
* per-request JSONL with `timestamp` in milliseconds (Mooncake: `input_length`, `output_length`);
* numeric timestamps that are Unix time are read in the unit that makes them so: a CSV of epoch
  milliseconds (1.7e12) as milliseconds, a JSONL of epoch seconds (1.7e9) as seconds (`_time_unit_s`);
  a `timestamp_ms` / `timestamp_s` column says its unit outright; datetimes may carry a UTC offset;
* per-window count series `t_s,total_rate_rps` (ServeGen, 10-minute windows), or `t_s,requests`
  (or `count`) with the requests in each window. Exactly-zero windows
  in a busy series are logging gaps, so they become missing data (NaN), not zero traffic; so do the
  windows of rows the log lacks.
"""

from __future__ import annotations

import csv
import datetime as dt
import gzip
import io
import json
import math
import zlib
from collections import deque
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np

# Column names we accept, first match wins (lower-cased before matching).
_INPUT_COLUMNS = ("contexttokens", "input_tokens", "input_length", "prompt_tokens", "request tokens",
                  "request_tokens", "prompt_len", "input_len")
_OUTPUT_COLUMNS = ("generatedtokens", "output_tokens", "output_length", "completion_tokens", "response tokens",
                   "response_tokens", "output_len")
# Timestamp columns and the unit each says (None: the format's default, or the epoch rule).
_TIME_COLUMNS = {"timestamp": None, "timestamp_s": 1.0, "timestamp_ms": 1e-3}
_GZIP_MAGIC = b"\x1f\x8b"
# Absolute timestamps: seconds since the Unix epoch from 2001 to 5138, in one of these units.
_EPOCH_SPAN_S = (1e9, 1e11)
_UNITS_S = (1.0, 1e-3, 1e-6, 1e-9)
_UNIT_NAMES = {1.0: "s", 1e-3: "ms", 1e-6: "us", 1e-9: "ns"}
_RATE_COLUMNS = ("total_rate_rps", "rate_rps")
_COUNT_COLUMNS = ("requests", "count", "total_requests")  # requests per window: divided by the window
# A window with exactly zero requests in a series that normally sees at least this many requests per
# window cannot be real traffic (Poisson probability of zero is e^-100): it is a logging gap.
_GAP_MIN_TYPICAL_REQUESTS = 100.0


class TraceError(ValueError):
    """A trace (or cold-start file) that cannot be read, with a message saying what is wrong."""


@dataclass(frozen=True)
class RequestTrace:
    """One row per request. Times in seconds from the first request; token arrays may be None."""

    name: str
    arrival_s: np.ndarray
    input_tokens: np.ndarray | None
    output_tokens: np.ndarray | None
    source_format: str
    rate_scale: float = 1.0

    kind = "requests"

    @property
    def has_tokens(self) -> bool:
        return self.input_tokens is not None and self.output_tokens is not None

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1]) if len(self.arrival_s) else 0.0

    def describe(self) -> str:
        return (
            f"{self.name}: {len(self.arrival_s)} requests over {self.duration_s / 60:.1f} min "
            f"({self.source_format}{', with token counts' if self.has_tokens else ''}"
            f"{f', rate x{self.rate_scale:g}' if self.rate_scale != 1 else ''})"
        )


@dataclass(frozen=True)
class SeriesTrace:
    """Request rate per fixed window; `rate_rps[i]` covers [t_s[i], t_s[i] + window_s). NaN = missing."""

    name: str
    t_s: np.ndarray
    rate_rps: np.ndarray
    window_s: float
    source_format: str
    rate_scale: float = 1.0
    # Coefficient of variation of inter-arrival times inside each window (ServeGen's rate_weighted_cv);
    # None when the series does not record it (arrivals inside a window are then a smooth flow).
    cv: np.ndarray | None = None

    kind = "series"
    has_tokens = False

    @property
    def duration_s(self) -> float:
        return float(self.t_s[-1] + self.window_s) if len(self.t_s) else 0.0

    @property
    def missing_windows(self) -> int:
        return int(np.isnan(self.rate_rps).sum())

    def describe(self) -> str:
        return (
            f"{self.name}: {len(self.t_s)} windows of {self.window_s:g}s over {self.duration_s / 86400:.2f} days, "
            f"{self.missing_windows} missing ({self.source_format}"
            f"{f', rate x{self.rate_scale:g}' if self.rate_scale != 1 else ''})"
        )


Trace = RequestTrace | SeriesTrace


def load_trace(path: str | Path, rate_scale: float = 1.0, seed: int = 0) -> Trace:
    """Read any supported trace, detect its format and apply `rate_scale` (see `scale_requests`)."""
    path = Path(path)
    if not (isinstance(rate_scale, int | float) and math.isfinite(rate_scale) and rate_scale > 0):
        raise TraceError(f"--rate-scale must be a positive number, got {rate_scale!r}")
    try:
        text = read_text(path)
    except FileNotFoundError:
        raise TraceError(f"trace file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"cannot read trace {path}: {e}") from None
    stripped = text.lstrip()
    if not stripped:
        raise TraceError(f"trace {path} is empty")
    if stripped.startswith("{"):
        trace: Trace = _read_jsonl(path.name, text)
    else:
        trace = _read_csv(path.name, text)
    if isinstance(trace, SeriesTrace):
        return SeriesTrace(trace.name, trace.t_s, trace.rate_rps * rate_scale, trace.window_s,
                           trace.source_format, rate_scale, trace.cv)
    return scale_requests(trace, rate_scale, seed)


def read_text(path: Path) -> str:
    """A file's UTF-8 text, gunzipped first when it is gzip (by its magic bytes, not its name): request
    logs of weeks are often kept compressed. A damaged gzip file raises OSError, like an unreadable one."""
    raw = path.read_bytes()
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (EOFError, zlib.error) as e:  # truncated or corrupt (gzip.BadGzipFile is an OSError already)
            raise OSError(f"damaged gzip file: {e}") from None
    return raw.decode("utf-8")


def scale_requests(trace: RequestTrace, rate_scale: float, seed: int = 0) -> RequestTrace:
    """Thin (x < 1) or replicate (x > 1) requests while keeping the trace's time shape.

    Each request is kept floor(x) times plus once more with probability frac(x). A copy is placed at
    a uniformly random time between its request and the next one, so scaling adds load without
    inventing instant bursts of identical requests.
    """
    if rate_scale == 1.0:
        return trace
    rng = np.random.default_rng(seed)
    n = len(trace.arrival_s)
    copies = np.floor(rate_scale).astype(int) + (rng.random(n) < rate_scale - math.floor(rate_scale))
    idx = np.repeat(np.arange(n), copies)
    if len(idx) == 0:
        raise TraceError(f"--rate-scale {rate_scale:g} left no requests in {trace.name}")
    gaps = np.diff(trace.arrival_s, append=trace.arrival_s[-1])
    first_copy = np.ones(len(idx), dtype=bool)
    first_copy[1:] = idx[1:] != idx[:-1]
    jitter = np.where(first_copy, 0.0, rng.random(len(idx)) * gaps[idx])
    t = trace.arrival_s[idx] + jitter
    order = np.argsort(t, kind="stable")
    pick = idx[order]
    return RequestTrace(
        trace.name,
        t[order],
        None if trace.input_tokens is None else trace.input_tokens[pick],
        None if trace.output_tokens is None else trace.output_tokens[pick],
        trace.source_format,
        rate_scale,
    )


def _finish_requests(name: str, fmt: str, t: np.ndarray, inp: np.ndarray | None, out: np.ndarray | None) -> RequestTrace:
    if len(t) == 0:
        raise TraceError(f"trace {name} has a header but no requests")
    if not np.all(np.isfinite(t)):
        raise TraceError(f"trace {name} has non-numeric or missing timestamps")
    order = np.argsort(t, kind="stable")  # logs are usually sorted; do not rely on it
    t = t[order] - t[order][0]
    for label, arr in (("input", inp), ("output", out)):
        if arr is not None and (not np.all(np.isfinite(arr)) or np.any(arr < 0)):
            raise TraceError(f"trace {name} has negative or non-numeric {label} token counts")
    return RequestTrace(
        name, t.astype(float),
        None if inp is None else inp[order].astype(float),
        None if out is None else out[order].astype(float),
        fmt,
    )


def _read_jsonl(name: str, text: str) -> RequestTrace:
    ts: list[float] = []
    inp: list[float] = []
    out: list[float] = []
    tokens = True
    unit: float | None = None  # stated by a timestamp_ms / timestamp_s key
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(f"{name} line {lineno}: not JSON ({e.msg})") from None
        key = _time_key(row) if isinstance(row, dict) else None
        if key is None:
            raise TraceError(f"{name} line {lineno}: a JSONL trace needs a 'timestamp' (ms) in every object")
        try:
            ts.append(float(row[key]))
        except (TypeError, ValueError):
            raise TraceError(f"{name} line {lineno}: timestamp {row[key]!r} is not a number") from None
        stated = _TIME_COLUMNS[str(key).lower()]
        if unit is None:
            unit = stated
        elif stated is not None and stated != unit:
            raise TraceError(f"{name} line {lineno}: {key!r} mixes timestamp units with earlier lines")
        i = _first(row, _INPUT_COLUMNS)
        o = _first(row, _OUTPUT_COLUMNS)
        if i is None or o is None:
            tokens = False
        else:
            try:
                inp.append(float(i))
                out.append(float(o))
            except (TypeError, ValueError):
                raise TraceError(f"{name} line {lineno}: token counts must be numbers") from None
    t = np.asarray(ts)
    scale = unit if unit is not None else _time_unit_s(t, default=1e-3)
    return _finish_requests(
        name, f"jsonl (timestamp {_UNIT_NAMES[scale]})", t * scale,
        np.asarray(inp) if tokens else None, np.asarray(out) if tokens else None,
    )


def _time_key(row: dict) -> str | None:
    """The row's timestamp key (any case), or None."""
    for k in row:
        if str(k).lower() in _TIME_COLUMNS:
            return k
    return None


def _time_unit_s(t: np.ndarray, default: float) -> float:
    """Seconds per timestamp unit. Unix time is about 1.7e9 s now: timestamps whose earliest lies within
    [1e9, 1e11) seconds (2001 to 5138) read in s, ms, us or ns are absolute times in that unit. Smaller
    ones count from the trace's start, in the format's `default` unit (seconds for CSV, ms for JSONL)."""
    finite = t[np.isfinite(t)]
    if finite.size == 0:
        return default
    low = float(np.min(finite))
    for unit in _UNITS_S:
        if _EPOCH_SPAN_S[0] <= low * unit < _EPOCH_SPAN_S[1]:
            return unit
    return default


def _first(row: dict, keys: tuple[str, ...]) -> object:
    lowered = {str(k).lower(): v for k, v in row.items()}
    for k in keys:
        if k in lowered:
            return lowered[k]
    return None


def _read_csv(name: str, text: str) -> Trace:
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader)
    except StopIteration:
        raise TraceError(f"trace {name} is empty") from None
    cols = [h.strip().lower() for h in header]
    rows = [r for r in reader if r and any(c.strip() for c in r)]
    if "t_s" in cols and any(c in cols for c in _RATE_COLUMNS + _COUNT_COLUMNS):
        return _read_series(name, cols, rows)
    ti = next((i for i, c in enumerate(cols) if c in _TIME_COLUMNS), None)
    if ti is None:
        raise TraceError(
            f"{name}: unrecognised CSV header {header!r}; expected a per-request trace with a "
            "'timestamp' column (optionally input/output token columns) or a series 't_s,total_rate_rps'"
        )
    ii = next((cols.index(c) for c in _INPUT_COLUMNS if c in cols), None)
    oi = next((cols.index(c) for c in _OUTPUT_COLUMNS if c in cols), None)
    for n, r in enumerate(rows, 2):
        if len(r) != len(cols):
            raise TraceError(f"{name} line {n}: {len(r)} fields, header has {len(cols)}")
    raw_t = [r[ti].strip() for r in rows]
    if not raw_t:
        raise TraceError(f"trace {name} has a header but no requests")
    try:
        t = np.asarray([float(x) for x in raw_t])
    except ValueError:
        t, fmt = _datetimes_s(name, raw_t), "csv (datetime timestamps)"
    else:
        stated = _TIME_COLUMNS[cols[ti]]
        unit = stated if stated is not None else _time_unit_s(t, default=1.0)
        t, fmt = t * unit, f"csv (timestamp {_UNIT_NAMES[unit]})"
    inp = out = None
    if ii is not None and oi is not None:
        try:
            inp = np.asarray([float(r[ii]) for r in rows])
            out = np.asarray([float(r[oi]) for r in rows])
        except ValueError:
            raise TraceError(f"{name}: token counts must be numbers") from None
    return _finish_requests(name, fmt, t, inp, out)


def _datetimes_s(name: str, raw: list[str]) -> np.ndarray:
    """Seconds since the earliest of these datetimes. ISO 8601 with or without a UTC offset ('Z',
    '+08:00': converted to UTC) or Azure's 7-digit fractions; naive ones are taken as they are."""
    if not any(x.endswith("Z") or "+" in x[10:] or x[10:].count("-") for x in raw):
        try:
            stamps = np.asarray(raw, dtype="datetime64[ns]")
        except ValueError as e:
            raise TraceError(f"{name}: timestamps are neither numbers nor datetimes ({e})") from None
        if np.any(np.isnat(stamps)):
            raise TraceError(f"{name}: some timestamps are empty") from None
        return (stamps - stamps.min()).astype("timedelta64[ns]").astype(np.int64) / 1e9
    try:
        parsed = [dt.datetime.fromisoformat(x) for x in raw]
    except ValueError as e:
        raise TraceError(f"{name}: timestamps are neither numbers nor datetimes ({e})") from None
    if any(p.tzinfo is None for p in parsed) and any(p.tzinfo is not None for p in parsed):
        raise TraceError(f"{name}: some timestamps carry a UTC offset and some do not")
    secs = np.asarray([p.timestamp() if p.tzinfo is not None else (p - dt.datetime(1970, 1, 1)).total_seconds()
                       for p in parsed])
    return secs - secs.min()


def _read_series(name: str, cols: list[str], rows: list[list[str]]) -> SeriesTrace:
    ti = cols.index("t_s")
    ri = next(cols.index(c) for c in _RATE_COLUMNS + _COUNT_COLUMNS if c in cols)
    counts = cols[ri] in _COUNT_COLUMNS
    ci = cols.index("active_clients") if "active_clients" in cols else None
    vi = cols.index("rate_weighted_cv") if "rate_weighted_cv" in cols else None
    if len(rows) < 2:
        raise TraceError(f"series {name} needs at least two windows, has {len(rows)}")
    try:
        t = np.asarray([float(r[ti]) for r in rows])
        rate = np.asarray([float(r[ri]) if r[ri].strip() else math.nan for r in rows])
    except (ValueError, IndexError):
        raise TraceError(f"series {name}: t_s and the rate must be numbers on every row") from None
    clients = np.asarray([float(r[ci] or 0) for r in rows]) if ci is not None else None
    cv = None
    if vi is not None:
        try:
            cv = np.asarray([float(r[vi]) if len(r) > vi and r[vi].strip() else math.nan for r in rows])
        except ValueError:
            raise TraceError(f"series {name}: rate_weighted_cv must be a number (or empty) on every row") from None
        if np.any(cv[np.isfinite(cv)] < 0):
            raise TraceError(f"series {name}: negative rate_weighted_cv")
    if np.any(rate[np.isfinite(rate)] < 0):
        raise TraceError(f"series {name}: negative request rates")
    window, slots = _window_slots(name, t)
    if counts:
        rate = rate / window
    if len(slots) < int(slots[-1]) + 1:  # a row absent from the log is a logging gap: missing data, not zero traffic
        rate, clients, cv = (_spread(a, slots) for a in (rate, clients, cv))
        t = t[0] + window * np.arange(len(rate))
    typical = np.nanmedian(rate) * window if np.any(np.isfinite(rate)) else 0.0
    zero = rate == 0
    if clients is not None:
        zero &= clients == 0
    if typical >= _GAP_MIN_TYPICAL_REQUESTS:
        rate = np.where(zero, math.nan, rate)
    if not np.any(np.isfinite(rate)):
        raise TraceError(f"series {name} has no usable windows")
    fmt = f"series ({window:g}s windows{', inter-arrival CV' if cv is not None else ''})"
    return SeriesTrace(name, t - t[0], rate, window, fmt, cv=cv)


def _window_slots(name: str, t: np.ndarray) -> tuple[float, np.ndarray]:
    """(the window, each row's window index from the first). Rows must be in time order; the window is the
    typical (median) step, and a step of a whole number of windows means rows are missing in between."""
    steps = np.diff(t)
    if np.any(steps <= 0):
        raise TraceError(f"series {name}: t_s must increase from row to row")
    window = float(np.median(steps))
    slots = np.rint((t - t[0]) / window)
    if not np.allclose(slots * window, t - t[0], rtol=0.0, atol=1e-6 * window):
        raise TraceError(f"series {name}: t_s must increase by a constant window, or whole multiples of it where "
                         f"rows are missing (got steps {np.unique(steps)[:5]})")
    return window, slots.astype(int)


def _spread(a: np.ndarray | None, slots: np.ndarray) -> np.ndarray | None:
    """`a` placed at its window indices, NaN in the windows no row has."""
    if a is None:
        return None
    out = np.full(int(slots[-1]) + 1, math.nan)
    out[slots] = a
    return out


@dataclass(frozen=True)
class ColdStartModel:
    """Start-to-ready durations: one fixed value, or samples drawn from a measured distribution."""

    samples_s: np.ndarray
    label: str

    @property
    def fixed(self) -> bool:
        return len(self.samples_s) == 1

    def quantile(self, q: float) -> float:
        return float(np.quantile(self.samples_s, q))

    def sampler(self, seed: int) -> ColdStartSampler:
        return ColdStartSampler(self, seed)


class ColdStartSampler:
    """Seeded stream of cold starts. `peek(k)` shows the next k without using them (the oracle's foresight)."""

    def __init__(self, model: ColdStartModel, seed: int) -> None:
        self._model = model
        self._rng = np.random.default_rng(seed + 7919)
        self._ahead: deque[float] = deque()

    def _fill(self, k: int) -> None:
        s = self._model.samples_s
        while len(self._ahead) < k:
            self._ahead.append(float(s[0] if len(s) == 1 else s[self._rng.integers(len(s))]))

    def peek(self, k: int = 1) -> float:
        """The longest of the next `k` cold starts."""
        self._fill(max(k, 1))
        return max(islice(self._ahead, max(k, 1)))

    def upcoming(self, k: int) -> list[float]:
        """The next `k` cold starts in the order replicas started from now will get them."""
        self._fill(max(k, 1))
        return list(islice(self._ahead, max(k, 1)))

    def draw(self) -> float:
        self._fill(1)
        return self._ahead.popleft()


def load_cold_start(spec: str | float) -> ColdStartModel:
    """`30` (seconds) or a CSV file with a `cold_start_ms` or `cold_start_s` column."""
    try:
        seconds = float(spec)
    except (TypeError, ValueError):
        seconds = None
    if seconds is not None:
        if not math.isfinite(seconds) or seconds < 0:
            raise TraceError(f"--cold-start must be a non-negative number of seconds or a file, got {spec!r}")
        return ColdStartModel(np.asarray([seconds]), f"{seconds:g} s")
    path = Path(str(spec))
    try:
        text = read_text(path)
    except FileNotFoundError:
        raise TraceError(f"--cold-start: neither a number nor an existing file: {spec!r}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"cannot read cold-start file {path}: {e}") from None
    reader = csv.reader(io.StringIO(text))
    header = [h.strip().lower() for h in next(reader, [])]
    for col, scale in (("cold_start_ms", 1e-3), ("cold_start_s", 1.0)):
        if col in header:
            i = header.index(col)
            try:
                values = np.asarray([float(r[i]) * scale for r in reader if r and r[i].strip()])
            except (ValueError, IndexError):
                raise TraceError(f"{path.name}: {col} must be numbers on every row") from None
            if len(values) == 0 or not np.all(np.isfinite(values)) or np.any(values < 0):
                raise TraceError(f"{path.name}: {col} needs at least one non-negative number")
            return ColdStartModel(
                values,
                f"{path.name} (n={len(values)}, p50 {np.quantile(values, 0.5):.1f} s, p95 {np.quantile(values, 0.95):.1f} s)",
            )
    raise TraceError(f"{path.name}: a cold-start file needs a 'cold_start_ms' or 'cold_start_s' column, header is {header}")
