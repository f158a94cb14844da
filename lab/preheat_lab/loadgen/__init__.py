"""Trace-replay load generator: real `/v1/completions` requests at a trace's (compressed) pace.

`schedule` turns a trace into arrivals, `endpoints` finds the ready serving replicas (EndpointSlices),
`replay` sends the requests and records latency and SLO per request. `python -m preheat_lab.loadgen`
is the command line.
"""

from .endpoints import EndpointSliceWatcher, EndpointSource, StaticEndpoints, check_loopback
from .replay import ReplayConfig, Replayer, RequestRecord, percentile, summarize
from .schedule import Arrival, TokenShaping, from_rate_series, from_requests, from_trace, offered_rate

__all__ = [
    "Arrival",
    "EndpointSliceWatcher",
    "EndpointSource",
    "ReplayConfig",
    "Replayer",
    "RequestRecord",
    "StaticEndpoints",
    "TokenShaping",
    "check_loopback",
    "from_rate_series",
    "from_requests",
    "from_trace",
    "offered_rate",
    "percentile",
    "summarize",
]
