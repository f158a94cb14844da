"""Closed-loop experiment: the operator against replayed trace load on a real cluster.

`experiment` runs preheat mode and reactive-only mode of the same operator on one schedule,
`sampler` records status and pods, `metrics` computes SLO attainment, replica-seconds, capacity lead
and hidden cold starts, `plot` draws the PNG. `python -m preheat_lab.closedloop` is the command line.
"""

from .experiment import MODES, Comparison, LoopConfig, compare, endpoint_manifest, run_mode
from .metrics import PodView, Sample

__all__ = ["MODES", "Comparison", "LoopConfig", "PodView", "Sample", "compare", "endpoint_manifest", "run_mode"]
