"""Build forecasters by name and restore them from their serialised state."""

from __future__ import annotations

from typing import Any

from preheat.scaling.forecast.base import Forecaster
from preheat.scaling.forecast.ensemble import EnsembleForecaster
from preheat.scaling.forecast.holt_winters import DAY_S, HoltWinters
from preheat.scaling.forecast.quantile import DEFAULT_HORIZONS_S, QuantileForecaster
from preheat.scaling.forecast.restore import forecaster_from_dict
from preheat.scaling.forecast.simple import Persistence, SeasonalNaive
from preheat.scaling.forecast.trend import TrendForecaster

__all__ = ["KINDS", "forecaster_from_dict", "make_forecaster", "season_knots"]

KINDS = ("auto", "ensemble", "holt-winters", "trend", "persistence", "seasonal-naive")


def season_knots(step_s: float, season_s: float = DAY_S, bucket_s: float = 1800.0) -> int:
    """Knots of a seasonal profile: 30-minute buckets (48 a day), coarser only for coarser samples.

    Any sample spacing (15 s, 60 s, 10-minute windows) is resampled onto these knots; the profile
    between them is linear (why 30 minutes: see HoltWinters).
    """
    if not step_s > 0:
        raise ValueError(f"step_s must be positive, got {step_s!r}")
    return max(1, round(season_s / max(step_s, bucket_s)))


def make_forecaster(
    kind: str = "auto",
    step_s: float = 60.0,
    season_s: float = DAY_S,
    weekly: bool = False,
    quantile_tracking: bool = True,
    horizons_s: tuple[float, ...] = DEFAULT_HORIZONS_S,
    **params: Any,
) -> Forecaster:
    """A forecaster by name, sized for samples every `step_s` seconds.

    kinds: "auto" (= "ensemble": Holt-Winters, trend and persistence weighted per horizon by their
    recent errors), "holt-winters" (seasonal, falling back to the trend model while history is
    short), "trend" (damped Holt), "persistence", "seasonal-naive". Extra keyword arguments go to
    the Holt-Winters or trend constructor. With `quantile_tracking` (the default) the model is
    wrapped in a QuantileForecaster, so `forecast_upper` comes from its measured errors.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown forecaster kind {kind!r}; choose one of {', '.join(KINDS)}")
    knots = season_knots(step_s, season_s)
    base: Forecaster
    if kind in ("auto", "ensemble"):
        base = EnsembleForecaster(
            {
                "holt-winters": HoltWinters(season_s=season_s, knots=knots, weekly=weekly, **params),
                "trend": TrendForecaster(),
                "persistence": Persistence(),
            },
            horizons_s=horizons_s,
        )
    elif kind == "holt-winters":
        base = HoltWinters(season_s=season_s, knots=knots, weekly=weekly, **params)
    elif kind == "trend":
        base = TrendForecaster(**params)
    elif kind == "persistence":
        base = Persistence()
    else:
        # textbook seasonal naive: the value one season ago at the sample resolution (<= 1440 a day)
        base = SeasonalNaive(season_s=season_s, knots=min(1440, max(1, round(season_s / step_s))))
    return QuantileForecaster(base) if quantile_tracking else base
