"""What holding an SLO costs with Preheat against what a user runs today: at each SLO target of a
`preheat frontier` run, Preheat's cost against the cheapest baseline's (every autoscaler and the
fixed fleet; the oracle is the reference, not a competitor), on the U grid and between grid points,
and against the oracle's.

On a 0.1 grid of U a policy whose point lands just past the target looks cheap and one whose point
lands just short looks dear, so each comparison is also made between grid points (`interpolated`).
"""

from __future__ import annotations

import itertools
from typing import Any

SUBJECT = "preheat"
REFERENCE = "oracle"


def interpolated_cost(points: list[dict[str, Any]], target: float) -> float | None:
    """Replica-seconds at which the frontier (points by cost, attainment interpolated linearly
    between neighbours) first reaches `target`; None if no point does. Less coarse than cost_at_slo
    on a 0.1 grid of U, where a policy whose point lands just above the target looks cheap."""
    pts = sorted((p["replica_seconds"], p["slo_attainment"]) for p in points)
    best = None
    for (c0, a0), (c1, a1) in itertools.pairwise(pts):
        if a0 < target <= a1:
            c = c0 + (c1 - c0) * (target - a0) / (a1 - a0)
            best = c if best is None else min(best, c)
    reached = [c for c, a in pts if a >= target]
    if reached:
        best = min(reached) if best is None else min(best, min(reached))
    return best


def compare(policies: dict[str, Any]) -> dict[str, Any]:
    """Per SLO target (the keys of the policies' `cost_at_slo`): every policy's cost, the cheapest
    baseline, Preheat's margin below it (negative: above), Preheat's ratio to the oracle, and the same
    margin and ratio between grid points (`interpolated`; the oracle sweeps a finer grid of U than the
    others, so its grid point is nearer its curve than Preheat's is). None where a side does not reach the target."""
    targets = next(iter(policies.values()))["cost_at_slo"] if policies else {}
    out: dict[str, Any] = {}
    for target in targets:
        cost = {n: p["cost_at_slo"][target] for n, p in policies.items()}
        pre = cost.get(SUBJECT)
        out[target] = {**_against_best(cost), "preheat_vs_oracle": _ratio(cost)}
        out[target]["preheat_lowest"] = (None if out[target]["best_baseline"] is None
                                         else pre is not None and pre <= cost[out[target]["best_baseline"]])
        between = {n: interpolated_cost(p["points"], float(target)) for n, p in policies.items()}
        out[target]["interpolated"] = {**_against_best(between), "preheat_vs_oracle": _ratio(between)}
    return out


def _ratio(cost: dict[str, float | None]) -> float | None:
    """Preheat's cost over the oracle's; None where either does not reach the target."""
    pre, oracle = cost.get(SUBJECT), cost.get(REFERENCE)
    return None if pre is None or not oracle else pre / oracle


def _against_best(cost: dict[str, float | None]) -> dict[str, Any]:
    """{cost, the cheapest baseline reaching the target, Preheat's margin below it} from each policy's cost."""
    others = {n: c for n, c in cost.items() if n not in (SUBJECT, REFERENCE) and c is not None}
    best = min(others, key=others.get) if others else None
    pre = cost.get(SUBJECT)
    return {"cost": cost, "best_baseline": best,
            "margin_vs_best": None if pre is None or best is None else 1 - pre / others[best]}


def margin_text(row: dict[str, Any]) -> str:
    """Preheat's margin against the cheapest baseline, in words."""
    m, best = row["margin_vs_best"], row["best_baseline"]
    if best is None:
        return "no baseline reaches it"
    if m is None:
        return "Preheat does not reach it"
    return f"{100 * abs(m):.1f} % {'below' if m > 0 else 'above'} {best}"


def summary(verdict: dict[str, Any]) -> list[str]:
    """One line per SLO target, for the terminal: Preheat's cost, the cheapest baseline's, the margin on
    the grid and between grid points, and the ratio to the oracle."""
    lines = []
    for target, row in verdict.items():
        pre, best = row["cost"].get(SUBJECT), row["best_baseline"]
        hours = "does not reach it" if pre is None else f"{pre / 3600:.1f} h"
        line = f"  at {100 * float(target):g} %: Preheat {hours}"
        if best is not None:
            line += (f"; cheapest baseline {best} {row['cost'][best] / 3600:.1f} h: {margin_text(row)} "
                     f"(between grid points {margin_text(row['interpolated'])})")
        else:
            line += "; no baseline reaches it"
        if row["preheat_vs_oracle"] is not None:
            line += f"; {row['preheat_vs_oracle']:.2f}x the oracle"
            between = row["interpolated"].get("preheat_vs_oracle")
            if between is not None:
                line += f" ({between:.2f}x between grid points)"
        lines.append(line)
    return lines
