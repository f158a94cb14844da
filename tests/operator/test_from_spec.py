"""An endpoint's autoscaler across operator restarts: the persisted forecaster keeps its clock (time
compression), and a state built for other forecasting settings is refused so the operator rebuilds from
Prometheus instead."""

from __future__ import annotations

import json

import pytest
from preheat.controller.spec import parse_spec
from preheat.scaling.autoscaler import Autoscaler
from preheat.scaling.from_spec import (
    TimeScaledForecaster,
    autoscaler_from_spec,
    forecasting_key,
    policy_config,
    restore_autoscaler,
    saved_state,
)
from preheat.scaling.policy import Observation


def spec(**forecasting):
    return parse_spec({"model": {"builtin": "tiny"}, "scaling": {"intervalSeconds": 3, "forecasting": forecasting}})


def fed(autoscaler: Autoscaler, n: int = 300) -> Autoscaler:
    for i in range(n):
        autoscaler.step(Observation(time_s=1_800_000_000.0 + 3 * i, value=2.0 + (i % 120) / 60, serving_ready=1,
                               current_serving=1))
    return autoscaler


def test_time_compressed_autoscaler_survives_a_restart_with_the_same_forecasts():
    s = spec(forecaster="holt-winters", timeCompression=240)
    config = policy_config(s)
    autoscaler = fed(autoscaler_from_spec(s, config))
    saved = json.loads(json.dumps(saved_state(autoscaler, forecasting_key(s, config.decision_interval_s))))
    restored = restore_autoscaler(saved, config, s)
    assert isinstance(restored.forecaster, TimeScaledForecaster) and restored.forecaster.scale == 240.0
    t = 1_800_000_000.0 + 900
    assert restored.forecaster.forecast(t, 30.0) == pytest.approx(autoscaler.forecaster.forecast(t, 30.0))
    assert restored.state == autoscaler.state


def test_a_state_built_for_other_forecasting_settings_is_refused():
    old = spec(forecaster="holt-winters", timeCompression=240)
    saved = saved_state(fed(autoscaler_from_spec(old)), forecasting_key(old, 3.0))
    for changed in (spec(forecaster="holt-winters"), spec(forecaster="auto", timeCompression=240),
                    spec(forecaster="holt-winters", timeCompression=240, seasonalitySeconds=604800)):
        assert forecasting_key(changed, 3.0) != saved["forecasting"]
        with pytest.raises(ValueError, match="built for"):
            restore_autoscaler(saved, policy_config(changed), changed)
    # a policy-only change (bounds, window) keeps the learned state
    same = spec(forecaster="holt-winters", timeCompression=240, windowSeconds=45)
    restore_autoscaler(saved, policy_config(same), same)


def test_state_saved_before_the_forecasting_key_existed_still_restores():
    s = spec()
    saved = saved_state(fed(autoscaler_from_spec(s), 50), forecasting_key(s, 3.0))
    del saved["forecasting"]
    assert restore_autoscaler(saved, policy_config(s), s).forecaster is not None


def test_forecast_window_reaches_the_policy():
    assert policy_config(spec(windowSeconds=45)).forecast_window_s == 45.0
    assert policy_config(spec()).forecast_window_s is None
