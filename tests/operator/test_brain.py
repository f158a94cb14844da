"""The operator's brain across restarts: the persisted forecaster keeps its clock (time compression), and a
state built for other forecasting settings is refused so the operator rebuilds from Prometheus instead."""

from __future__ import annotations

import json

import pytest
from preheat.controller.brain import Brain, TimeScaledForecaster, forecasting_key, policy_config
from preheat.controller.spec import parse_spec
from preheat.scaling.policy import Observation


def spec(**forecasting):
    return parse_spec({"model": {"builtin": "tiny"}, "scaling": {"intervalSeconds": 3, "forecasting": forecasting}})


def fed(brain: Brain, n: int = 300) -> Brain:
    for i in range(n):
        brain.step(Observation(time_s=1_800_000_000.0 + 3 * i, value=2.0 + (i % 120) / 60, serving_ready=1,
                               current_serving=1))
    return brain


def test_time_compressed_brain_survives_a_restart_with_the_same_forecasts():
    s = spec(forecaster="holt-winters", timeCompression=240)
    config = policy_config(s)
    brain = fed(Brain(config, s))
    saved = json.loads(json.dumps(brain.to_dict()))
    restored = Brain.from_dict(saved, config, s)
    assert isinstance(restored.forecaster, TimeScaledForecaster) and restored.forecaster.scale == 240.0
    t = 1_800_000_000.0 + 900
    assert restored.forecaster.forecast(t, 30.0) == pytest.approx(brain.forecaster.forecast(t, 30.0))
    assert restored.autoscaler.state == brain.autoscaler.state


def test_a_state_built_for_other_forecasting_settings_is_refused():
    old = spec(forecaster="holt-winters", timeCompression=240)
    saved = fed(Brain(policy_config(old), old)).to_dict()
    for changed in (spec(forecaster="holt-winters"), spec(forecaster="auto", timeCompression=240),
                    spec(forecaster="holt-winters", timeCompression=240, seasonalitySeconds=604800)):
        assert forecasting_key(changed, 3.0) != saved["forecasting"]
        with pytest.raises(ValueError, match="built for"):
            Brain.from_dict(saved, policy_config(changed), changed)
    # a policy-only change (bounds, window) keeps the learned state
    same = spec(forecaster="holt-winters", timeCompression=240, windowSeconds=45)
    Brain.from_dict(saved, policy_config(same), same)


def test_state_saved_before_the_forecasting_key_existed_still_restores():
    s = spec()
    saved = fed(Brain(policy_config(s), s), 50).to_dict()
    del saved["forecasting"]
    assert Brain.from_dict(saved, policy_config(s), s).forecaster is not None


def test_forecast_window_reaches_the_policy():
    assert policy_config(spec(windowSeconds=45)).forecast_window_s == 45.0
    assert policy_config(spec()).forecast_window_s is None
