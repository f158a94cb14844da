"""A one-day rate series repeated for N days: a noisy trace with a season to learn.

deepseek-r1's ServeGen series covers one day, so Preheat's forecaster never learns its season there
and every result on it is the reactive core's. Repeated, the same windows (rates and inter-arrival
CVs) recur daily while the simulator draws fresh arrivals each day: it asks whether what Preheat does
once its season is learned still holds on noisy traffic, not only on the 14-day series' smoother
windows. A lab check, not a production trace: the days are identical by construction.

    python -m preheat_lab.repeat_days ../shared/traces/servegen_deepseek-r1_10min.csv OUT.csv --days 7
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from preheat.scaling.forecast import DAY_S


def repeat_days(src: Path, dst: Path, days: int) -> int:
    """Write `src` (a `t_s,...` series within one day) `days` times, shifted a day each; returns the rows."""
    if days < 1:
        raise ValueError(f"--days must be >= 1, got {days}")
    with src.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        fields = reader.fieldnames
        rows = list(reader)
    if not fields or "t_s" not in fields or not rows:
        raise ValueError(f"{src}: expected a CSV series with a t_s column and at least one row")
    times = [float(r["t_s"]) for r in rows]
    if min(times) < 0 or max(times) >= DAY_S:
        raise ValueError(f"{src}: t_s must lie within one day [0, {DAY_S:g}) to be repeated daily")
    with dst.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for day in range(days):
            for row, t in zip(rows, times, strict=True):
                writer.writerow({**row, "t_s": _seconds(t + day * DAY_S)})
    return days * len(rows)


def _seconds(t: float) -> str:
    return str(int(t)) if t.is_integer() else repr(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--days", type=int, default=7)
    args = ap.parse_args(argv)
    try:
        n = repeat_days(args.src, args.dst, args.days)
    except (OSError, ValueError) as e:
        print(f"repeat_days: {e}", file=sys.stderr)
        return 2
    print(f"{args.dst}: {n} rows over {args.days} days")
    return 0


if __name__ == "__main__":
    sys.exit(main())
