"""Scaling: the pure part of Preheat, with no kopf, kubernetes, torch or I/O.

- `forecast/`: forecasters of the signal over the lead time.
- `policy/`: `decide`, the pure policy that turns an observation and a forecast into a decision with
  its reason.
- `autoscaler.py`: one endpoint's `Autoscaler` (forecaster + policy configuration and state), the
  object the operator and the simulator both step.
- `from_spec.py`: an InferenceEndpoint spec -> its Autoscaler, the one place both hosts build theirs
  (reads the typed spec of `preheat.controller.spec`; no I/O).
"""
