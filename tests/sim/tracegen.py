"""Small generated traces for the simulator tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_requests(path: Path, times: np.ndarray, inp: int = 100, out: int = 10) -> Path:
    """A plain `timestamp,input_tokens,output_tokens` trace (seconds)."""
    lines = ["timestamp,input_tokens,output_tokens"] + [f"{t:.3f},{inp},{out}" for t in times]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_series(path: Path, rates: list[float], window_s: int = 600) -> Path:
    lines = ["t_s,total_rate_rps"] + [f"{i * window_s},{r}" for i, r in enumerate(rates)]
    path.write_text("\n".join(lines) + "\n")
    return path
