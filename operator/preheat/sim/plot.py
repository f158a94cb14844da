"""PNG of one or more simulated policies: rate, forecast, capacity, replicas and SLO violations over time."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from preheat.sim.run import SimResult, Workload


def plot_results(
    results: list[SimResult], w: Workload, out: str | Path, title: str = "",
    window_s: tuple[float, float] | None = None, utilization: float = 1.0,
) -> Path:
    """One panel per policy; `window_s` = (start, end) zooms in (e.g. on a daily ramp)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    n = len(results)
    fig, axes = plt.subplots(n, 1, figsize=(12, 2.8 * n + 0.6), sharex=True, squeeze=False)
    span = w.trace.duration_s
    scale, unit = (3600.0, "h") if span > 3 * 3600 or window_s is not None else (60.0, "min")
    unit_sig = "req/s" if w.signal == "rps" else "tokens/s"
    for ax, r in zip(axes[:, 0], results, strict=True):
        tl = r.timeline
        ax.plot(tl["curve_t"] / scale, tl["curve_rate"], color="0.55", lw=0.6, label=f"demand ({unit_sig})")
        cap_label = "ready serving capacity" + (f" at {utilization:.0%} utilization" if utilization < 1 else "")
        ax.step(tl["t"] / scale, tl["serving_ready"] * w.target_per_replica * utilization, where="post",
                color="tab:blue", lw=1.0, label=cap_label)
        if np.isfinite(tl["forecast"]).any():
            ax.plot(tl["t"] / scale, tl["forecast"], color="tab:orange", lw=0.8, label="forecast at lead time")
        ax.set_ylabel(unit_sig)
        ax2 = ax.twinx()
        ax2.step(tl["t"] / scale, tl["serving_ready"], where="post", color="tab:green", lw=0.7, label="serving")
        if tl["warm_ready"].any():
            ax2.step(tl["t"] / scale, tl["warm_ready"], where="post", color="tab:purple", lw=0.7, label="warm")
        ax2.step(tl["t"] / scale, tl["starting"], where="post", color="tab:brown", lw=0.5, alpha=0.6, label="starting")
        ax2.set_ylabel("replicas")
        bad = tl["violations_per_s"] > 0
        if bad.any():
            ymax = np.nanmax(tl["curve_rate"]) if np.isfinite(tl["curve_rate"]).any() else 1.0
            ax.scatter(tl["curve_t"][bad] / scale, np.full(bad.sum(), ymax * 1.02), marker="|", color="red",
                       s=30, label="SLO violations")
        ax.set_title(
            f"{r.policy}: SLO attainment {100 * r.slo_attainment:.2f} %, "
            f"{r.replica_seconds / 3600:.1f} replica-hours, {r.scale_actions} scale actions",
            fontsize=9,
        )
        lines = ax.get_legend_handles_labels()
        lines2 = ax2.get_legend_handles_labels()
        ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=7, loc="upper left", ncol=4)
    if window_s is not None:
        for ax in axes[:, 0]:
            ax.set_xlim(window_s[0] / scale, window_s[1] / scale)
    axes[-1, 0].set_xlabel(f"time ({unit})")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
