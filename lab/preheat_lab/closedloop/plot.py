"""PNG of a closed-loop comparison: per mode, load against forecast and capacity, replicas, SLO misses."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_comparison(result: dict, path: str | Path, target_per_replica: float) -> Path:
    """One column per mode: (top) offered, observed and forecast rate against serving capacity;
    (middle) serving / warm / starting replicas; (bottom) SLO misses per 5 s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = result["modes"]
    fig, axes = plt.subplots(3, len(modes), figsize=(6.5 * len(modes), 8.5), sharex="col", squeeze=False)
    for col, (mode, r) in enumerate(modes.items()):
        s = r["series"]
        st = np.asarray(s["sample_t"], dtype=float)
        ax = axes[0][col]
        ax.plot(s["offered_t"], _smooth(s["offered_rps"], 5), color="0.4", lw=1.2, label="offered (5 s mean)")
        obs = np.array([np.nan if v is None else v for v in s["observed"]], dtype=float)
        fc = np.array([np.nan if v is None else v for v in s["forecast"]], dtype=float)
        ax.plot(st, obs, color="tab:blue", lw=1.2, label="observed (Prometheus)")
        ax.plot(st, fc, color="tab:orange", lw=1.2, ls="--", label="forecast at lead time")
        ax.step(st, np.asarray(s["serving"]) * target_per_replica, where="post", color="tab:green", lw=1.8,
                label="serving capacity")
        h = result.get("headline", {}).get(mode, {})
        att = h.get("slo_attainment")
        rs = h.get("replica_seconds")
        ttft = h.get("ttft_slo_attainment")
        ax.set_title(f"{mode}: SLO {'-' if att is None else f'{att:.1%}'}"
                     f"{'' if ttft is None else f' (TTFT {ttft:.1%})'}, "
                     f"{'-' if rs is None else f'{rs:.0f}'} replica-s, hidden cold starts {h.get('cold_starts_hidden')}, "
                     f"waited on one {h.get('cold_start_waits')}", fontsize=9)
        ax.set_ylabel("requests/s")
        ax.legend(fontsize=7, loc="upper left")
        ax = axes[1][col]
        ax.step(st, s["serving"], where="post", color="tab:green", label="serving (Ready)")
        ax.step(st, s["warm"], where="post", color="tab:purple", label="warm (Ready)")
        ax.step(st, s["starting"], where="post", color="tab:red", ls=":", label="starting")
        ax.plot(s["offered_t"], s["need"], color="0.5", lw=0.8, label="needed (offered / target)")
        # Orders of more serving replicas, marked by the term that won (forecast: the pre-scaling), or
        # the peer's rescales in its mode (hpa, keda, aibrix).
        for reason, marker, color in (("forecast", "^", "tab:orange"), ("reactive", "o", "tab:blue"),
                                      ("panic", "x", "tab:red"), ("hpa", "s", "tab:brown"),
                                      ("keda", "D", "tab:olive"), ("aibrix", "P", "tab:cyan")):
            o = [x for x in r.get("serving_orders", []) if x["reason"] == reason and x["t_s"] >= 0]
            if o:
                ax.scatter([x["t_s"] for x in o], [x["serving_to"] for x in o], marker=marker, color=color, s=28,
                           zorder=5, label=f"ordered serving ({reason})")
        ax.set_ylabel("replicas")
        ax.legend(fontsize=7, loc="upper left")
        ax = axes[2][col]
        ax.bar(s["violations_t"], s["violations"], width=4.5, align="edge", color="tab:red")
        ax.set_ylabel("SLO misses / 5 s")
        ax.set_xlabel("seconds since the replay started")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _smooth(values: list[float], k: int) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    if v.size < k:
        return v
    return np.convolve(v, np.ones(k) / k, mode="same")
