"""Online forecasters of the scaling signal: what will it be at now + h?

Pure Python (no kopf, torch or kubernetes, no I/O). Every forecaster takes one sample at a time,
tolerates gaps and bad samples, and serialises to JSON so the operator can persist it.
"""

from preheat.scaling.forecast.base import Forecaster
from preheat.scaling.forecast.ensemble import EnsembleForecaster
from preheat.scaling.forecast.holt_winters import DAY_S, WEEK_S, HoltWinters, SeasonProfile
from preheat.scaling.forecast.quantile import DEFAULT_HORIZONS_S, QuantileForecaster
from preheat.scaling.forecast.registry import KINDS, forecaster_from_dict, make_forecaster, season_knots
from preheat.scaling.forecast.simple import Persistence, SeasonalNaive
from preheat.scaling.forecast.trend import TrendForecaster

__all__ = [
    "DAY_S",
    "DEFAULT_HORIZONS_S",
    "KINDS",
    "WEEK_S",
    "EnsembleForecaster",
    "Forecaster",
    "HoltWinters",
    "Persistence",
    "QuantileForecaster",
    "SeasonProfile",
    "SeasonalNaive",
    "TrendForecaster",
    "forecaster_from_dict",
    "make_forecaster",
    "season_knots",
]
