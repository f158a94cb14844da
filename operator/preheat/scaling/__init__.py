"""Scaling: the pure part of Preheat, with no kopf, kubernetes, torch or I/O.

- `forecast/`: forecasters of the signal over the lead time.
- `policy/`: `decide`, the pure policy that turns an observation and a forecast into a decision with
  its reason.
- `autoscaler.py`: one endpoint's autoscaler (forecaster + policy state + cold-start window), the
  object the operator and the simulator both step.
"""
