"""Run the closed loop on a real cluster: endpoint + operator + trace replay, once per scaling mode.

One run of `compare()` plays the same schedule once per mode, sequentially:

* `preheat`: forecasting on and a warm pool (pre-scale ahead of the forecast, promote warm pods);
* `reactive`: the same operator with forecasting off and no warm pool: scale on observed load only,
  so every added replica is a cold start — Preheat's own HPA/KPA-style baseline;
* `hpa`: the real Kubernetes HPA (kube-controller-manager's) scales the endpoint's Deployment on the
  model server's request rate through prometheus-adapter; the operator runs the endpoint in
  `scaling.mode: Preview` (creates its objects, writes status, never touches replicas). See hpa.py.
* `keda`: a KEDA ScaledObject (prometheus trigger on Preheat's own rate query) scales it; keda.py.
* `aibrix`: an AIBrix PodAutoscaler (KPA on vllm:num_requests_running scraped from the pods); aibrix.py.

The three peers scale the same endpoint in Preview mode, each configured as its documentation
recommends for request-rate scaling of an inference server, with its own defaults otherwise.

For each mode it creates a namespace, starts `preheat operator` scoped to it (its /metrics
registered as a Prometheus scrape target when the cluster offers that), applies an
InferenceEndpoint, waits for the first replicas, replays the schedule against the serving pods
(EndpointSlice), samples status and pods every few seconds, then deletes everything it created.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from preheat_lab.loadgen import Arrival, EndpointSliceWatcher, ReplayConfig, Replayer, offered_rate, summarize

from . import aibrix as A
from . import hpa as H
from . import keda as K
from . import metrics as M
from . import modelstore as MS
from .history import HistoryWriter, ReloadWatch, TraceClock, history_visible
from .sampler import GROUP, PLURAL, VERSION, Sampler

log = logging.getLogger(__name__)

MODES = ("preheat", "reactive", "hpa", "keda", "aibrix")
# Modes in which another autoscaler scales the endpoint (in scaling.mode Preview, no warm pool).
PEERS = ("hpa", "keda", "aibrix")


@dataclass
class LoopConfig:
    """Sizing of the endpoint and the experiment for a small shared machine (see docs/closedloop.md)."""

    kubeconfig: Path
    prometheus_url: str
    out_dir: Path
    endpoint: str = "tiny"
    model: str = "tiny"
    target_per_replica: float = 1.5
    min_replicas: int = 1
    max_replicas: int = 5
    warm_pool_min: int = 1
    warm_pool_max: int = 2
    interval_s: float = 3.0
    scale_down_stabilization_s: int = 60
    slo_ms: float = 3000.0
    # Requests are streamed so the first token's arrival is measured; its SLO is a stated choice (a
    # second for an interactive answer), reported beside the end-to-end one.
    ttft_slo_ms: float = 1000.0
    stream: bool = True
    max_num_seqs: int = 2
    max_queue: int = 4
    # The model server's --min-step-ms (0: off). The local cluster's replicas share the host's two cores,
    # where the tiny model answers ~10x the per-replica target and no autoscaler can fall short; a step
    # floor makes each replica's capacity its own, as a GPU per replica does (see docs/closedloop.md).
    min_step_ms: float = 0.0
    # The workload's mean answer length in tokens (engine steps), set with min_step_ms: a paced
    # replica's answer then takes mean_output_tokens x min_step_ms (the aibrix mode's request time).
    mean_output_tokens: float | None = None
    window: str = "20s"
    panic_window: str = "10s"
    sample_interval_s: float = 2.0
    ready_timeout_s: float = 240.0
    queue_timeout_s: float = 10.0
    teardown_timeout_s: float = 90.0
    operator_cmd: Sequence[str] = (sys.executable, "-m", "preheat", "operator")
    register_target: Callable[[str, str, dict], Any] | None = None
    unregister_target: Callable[[str], Any] | None = None
    progress: Callable[[str], None] | None = None
    progress_every_s: float = 5.0
    # The forecaster, configured through the spec like any endpoint's: a seasonal model on the load's
    # clock (the replay is compressed `time_compression`x, so a day lasts 86400/240 = 360 s), looking
    # `forecast_window_s` ahead when that is longer than the lead time.
    forecaster: str = "holt-winters"
    seasonality_s: int = 86400
    time_compression: float = 240.0
    forecast_window_s: float | None = 45.0
    # The endpoint's past: when set, the trace before the slice is written into Prometheus before the
    # replay and the operator is asked to rebuild its forecaster from it (preheat_lab.closedloop.history).
    history: HistoryWriter | None = None
    history_rate: Callable[[np.ndarray], np.ndarray] | None = None
    slice_start_trace_s: float = 0.0
    history_start_trace_s: float = 0.0
    history_timeout_s: float = 90.0
    # hpa mode: prometheus-adapter's per-pod rate window (None: `window`, the one Preheat's rate reads),
    # and what makes the custom metrics API serve it on this cluster (called once per comparison that
    # has an hpa mode; returns what it started, for the JSON). None: the cluster already serves it.
    hpa_rate_window: str | None = None
    start_hpa_metrics: Callable[[dict], Any] | None = None
    # The weights: None serves the built-in `model` from the node's cache (a cold start of seconds); a
    # URI (the model store, modelstore.py) makes every replica download them first, as in production.
    # `model_store` describes what the store emulates, for the JSON.
    model_uri: str | None = None
    model_sha256: str | None = None
    model_store: dict | None = None
    # keda and aibrix modes: what starts that peer on this cluster (called once per comparison with the
    # mode's name; returns what it started, for the JSON). None: the cluster already runs it.
    start_peer: Callable[[str], Any] | None = None
    # aibrix mode: seconds a request spends in a replica, for the Little's-law target (aibrix.py);
    # None: aibrix.DEFAULT_REQUEST_S, one replica load-tested at its per-replica rate.
    aibrix_request_s: float | None = None

    def hpa_rules(self) -> dict:
        return H.adapter_rules(self.hpa_rate_window or self.window)


def step_floor_ms(slots: int, replica_rps: float, mean_output_tokens: float) -> float:
    """The engine step floor at which a replica serves `replica_rps`: `slots` answers of
    `mean_output_tokens` steps each (prefill gives the first token) finish every
    slots / replica_rps seconds."""
    if slots < 1 or replica_rps <= 0 or mean_output_tokens <= 0:
        raise ValueError(f"need slots >= 1, rate and tokens > 0, got {slots!r}, {replica_rps!r}, {mean_output_tokens!r}")
    return 1000.0 * slots / (replica_rps * mean_output_tokens)


def endpoint_manifest(cfg: LoopConfig, mode: str) -> dict:
    """The InferenceEndpoint of the run: the same in every mode but the peers'.

    Reactive-only is the operator's own switch (`preheat operator --reactive-only`: forecasts ignored,
    no warm pool), so preheat and reactive differ in nothing but the scaling mode. In the peers' modes
    (hpa, keda, aibrix) the endpoint is in `scaling.mode: Preview` with no warm pool: the Deployment's
    replicas belong to that autoscaler (`peer_manifest`), the rest (model, server, resources, min/max,
    target) is the same.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceEndpoint",
        "metadata": {"name": cfg.endpoint, "labels": {"preheat.dev/experiment": f"closedloop-{mode}"}},
        "spec": {
            "model": ({"uri": cfg.model_uri, **({"sha256": cfg.model_sha256} if cfg.model_sha256 else {})}
                      if cfg.model_uri else {"builtin": cfg.model}),
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
            "server": {"maxNumSeqs": cfg.max_num_seqs, "maxQueue": cfg.max_queue, "drainTimeoutSeconds": 5,
                       **({"extraArgs": ["--min-step-ms", f"{cfg.min_step_ms:g}"]} if cfg.min_step_ms else {})},
            "scaling": {
                "minReplicas": cfg.min_replicas,
                "maxReplicas": cfg.max_replicas,
                "signal": "requestsPerSecond",
                "targetPerReplica": cfg.target_per_replica,
                "intervalSeconds": cfg.interval_s,
                "scaleDownStabilizationSeconds": cfg.scale_down_stabilization_s,
                "warmPool": {"min": cfg.warm_pool_min, "max": cfg.warm_pool_max},
                "forecasting": {
                    "forecaster": cfg.forecaster,
                    "seasonalitySeconds": cfg.seasonality_s,
                    "timeCompression": cfg.time_compression,
                    **({"windowSeconds": cfg.forecast_window_s} if cfg.forecast_window_s else {}),
                },
            },
            "prometheus": {"url": cfg.prometheus_url, "window": cfg.window, "panicWindow": cfg.panic_window},
        },
    }
    if mode in PEERS:
        body["spec"]["scaling"].update(mode="Preview", warmPool={"min": 0, "max": 0})
    return body


def hpa_per_replica(cfg: LoopConfig) -> float:
    """The request rate per serving replica Preheat's policy sizes for on this endpoint: the spec's
    targetPerReplica at the policy's target utilization (`PolicyConfig.capacity_per_replica`, what it
    divides the rate by), read through the operator's own spec model and policy_config."""
    from preheat.controller.spec import parse_spec
    from preheat.scaling.from_spec import policy_config

    return policy_config(parse_spec(endpoint_manifest(cfg, "hpa")["spec"])).capacity_per_replica


def hpa_manifest(cfg: LoopConfig) -> dict:
    """The HPA of hpa mode, on the endpoint's Deployment: the per-replica rate Preheat's policy sizes
    for (`hpa_per_replica`) and the endpoint's min/max replicas; everything else the HPA's defaults."""
    from preheat.controller.builders import workload_name

    dep = workload_name(cfg.endpoint)
    return H.hpa_manifest(dep, dep, hpa_per_replica(cfg), cfg.min_replicas, cfg.max_replicas)


def keda_manifest(cfg: LoopConfig, namespace: str) -> dict:
    """The ScaledObject of keda mode: Preheat's own rate query for this endpoint (what the operator
    reads, over the same window), the per-replica rate the hpa mode's HPA gets, the endpoint's min/max."""
    from preheat.controller.builders import workload_name
    from preheat.controller.observe import default_queries

    query = default_queries(namespace, cfg.endpoint, cfg.window, cfg.panic_window)["rate"]
    return K.scaled_object(workload_name(cfg.endpoint), query=query, per_replica=hpa_per_replica(cfg),
                           server_address=cfg.prometheus_url, min_replicas=cfg.min_replicas,
                           max_replicas=cfg.max_replicas)


def aibrix_manifest(cfg: LoopConfig, request_s: float) -> dict:
    """The PodAutoscaler of aibrix mode: KPA on requests running per replica, the per-replica rate the
    other peers get converted by Little's law with `request_s` (aibrix.running_target)."""
    from preheat.controller.builders import workload_name
    from preheat.controller.spec import parse_spec

    port = parse_spec(endpoint_manifest(cfg, "aibrix")["spec"]).server.port
    return A.pod_autoscaler(workload_name(cfg.endpoint), target_running=A.running_target(hpa_per_replica(cfg), request_s),
                            min_replicas=cfg.min_replicas, max_replicas=cfg.max_replicas, port=port)


def peer_manifest(cfg: LoopConfig, mode: str, namespace: str, request_s: float | None = None) -> dict:
    """The object that makes `mode`'s autoscaler scale the endpoint's Deployment."""
    if mode == "hpa":
        return hpa_manifest(cfg)
    if mode == "keda":
        return keda_manifest(cfg, namespace)
    if mode == "aibrix":
        return aibrix_manifest(cfg, request_s if request_s is not None else A.DEFAULT_REQUEST_S)
    raise ValueError(f"{mode!r} is not a peer mode ({', '.join(PEERS)})")


_PEER_API = {"hpa": H, "keda": K, "aibrix": A}


def _peer_record(api: Any, core: Any, mode: str, namespace: str, name: str, t0_wall: float,
                 start_replicas: int) -> tuple[list[dict], dict, list[dict]]:
    """The peer's own record of the run: the Events its decisions come from, its status, and those
    decisions. KEDA's decisions are those of the HPA it made; AIBrix's are its PodAutoscaler's Events
    (the same "New size: N; reason: …" message)."""
    if mode == "aibrix":
        events = H.rescale_events(core, namespace, name, t0_wall, kind=A.KIND)
        status = A.read_status(api, namespace, name)
    elif mode == "keda":
        events = H.rescale_events(core, namespace, K.hpa_name(name), t0_wall)
        status = {"scaledObject": K.read_status(api, namespace, name),
                  "hpa": H.read_status(api, namespace, K.hpa_name(name))}
    else:
        events = H.rescale_events(core, namespace, name, t0_wall)
        status = H.read_status(api, namespace, name)
    return events, status, H.rescale_decisions(events, start_replicas, reason=mode)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OperatorProcess:
    """`preheat operator` as a real subprocess scoped to one namespace; its log goes to a file."""

    def __init__(self, cfg: LoopConfig, namespace: str, mode: str, log_path: Path):
        self.cfg, self.namespace, self.mode, self.log_path = cfg, namespace, mode, log_path
        self.metrics_port = free_port()
        self.proc: subprocess.Popen | None = None

    def argv(self) -> list[str]:
        argv = [*self.cfg.operator_cmd, "--namespace", self.namespace, "--metrics-port", str(self.metrics_port),
                "--prometheus-url", self.cfg.prometheus_url]
        if self.mode == "reactive" or self.mode in PEERS:
            # peers: the endpoint is in Preview (nothing applied); no forecast is drawn for a mode that has none
            argv.append("--reactive-only")
        return argv

    def start(self) -> None:
        env = dict(os.environ, KUBECONFIG=str(self.cfg.kubeconfig), PYTHONUNBUFFERED="1")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as logf:
            # its own process group, so stop() reaches anything it spawns and nothing else
            self.proc = subprocess.Popen(self.argv(), env=env, stdout=logf, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 15.0) -> None:
        if not self.proc or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


def _parse_time(v: Any) -> float | None:
    if not v:
        return None
    try:
        return dt.datetime.fromisoformat(str(v).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def decisions(samples: Sequence[M.Sample], t0_wall: float) -> list[dict]:
    """Distinct `status.lastDecision` values seen, on the experiment clock."""
    seen: dict[str, dict] = {}
    for s in samples:
        d = s.status.get("lastDecision") or {}
        key = json.dumps(d, sort_keys=True, default=str)
        if d and key not in seen:
            t = _parse_time(d.get("time"))
            seen[key] = {**d, "t_s": (t - t0_wall) if t is not None else s.t_s}
    return sorted(seen.values(), key=lambda d: d["t_s"])


def ensure_crd(api: Any, timeout_s: float = 60.0) -> None:
    """Install the InferenceEndpoint CRD (generated from the spec models) unless it is there already."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException
    from preheat.controller.crd import build_crd

    ext = client.ApiextensionsV1Api(api)
    crd = build_crd()
    try:
        ext.create_custom_resource_definition(crd)
    except ApiException as e:
        if e.status != 409:
            raise
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        obj = ext.read_custom_resource_definition(crd["metadata"]["name"])
        if any(c.type == "Established" and c.status == "True" for c in (obj.status.conditions or [])):
            return
        time.sleep(0.5)
    raise TimeoutError(f"CRD {crd['metadata']['name']} not Established after {timeout_s:g} s")


async def _wait_ready(cfg: LoopConfig, core: Any, namespace: str, want: int, operator: OperatorProcess) -> float:
    """Wait until `want` pods of the endpoint are Ready and one serves; returns seconds waited."""
    t0 = time.monotonic()
    sel = f"preheat.dev/endpoint={cfg.endpoint}"
    while True:
        pods = (await asyncio.to_thread(core.list_namespaced_pod, namespace, label_selector=sel)).items
        ready = [p for p in pods if any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))]
        serving = [p for p in ready if (p.metadata.labels or {}).get("preheat.dev/role") == "serving"]
        if len(ready) >= want and serving:
            return time.monotonic() - t0
        if not operator.alive():
            raise RuntimeError(f"preheat operator exited early; see {operator.log_path}")
        if time.monotonic() - t0 > cfg.ready_timeout_s:
            raise TimeoutError(
                f"{len(ready)}/{want} pods Ready ({len(serving)} serving) after {cfg.ready_timeout_s:g} s in {namespace}"
            )
        await asyncio.sleep(1.0)


REBUILD_ANNOTATION = "preheat.dev/rebuild-forecaster"


async def _install_history(cfg: LoopConfig, custom: Any, namespace: str, watch: ReloadWatch | None,
                           say: Callable[[str], None]) -> tuple[float, dict]:
    """Write the endpoint's past into Prometheus so it ends where the replay begins; return the replay's
    start (wall time) and what was written. The start is just after the Prometheus block reload that
    loads the history (its timer's phase from `watch`), so the operator's view is continuous: history
    up to the start, the replayed load after it. Then ask the operator to rebuild its forecaster."""
    assert cfg.history is not None and cfg.history_rate is not None
    if watch is not None and not watch.reloads:
        # The timer's phase is not known yet: wait for one reload (at most a period). Writing the block
        # blind would let Prometheus load it early, and the operator would see the history's last
        # minute as live load before the replay.
        deadline = time.time() + 75.0
        while not watch.reloads and time.time() < deadline:
            await asyncio.sleep(0.5)
    now = time.time()
    nxt = watch.next_reload(now + 3.0) if watch is not None else None
    # Still unknown (no reload in 75 s): one full period from now is surely after a reload.
    t0 = (nxt + 2.0) if nxt is not None else now + 65.0
    clock = TraceClock(t0_wall=t0, t0_trace=cfg.slice_start_trace_s, compress=cfg.time_compression)
    info = await asyncio.to_thread(cfg.history.write, namespace, cfg.endpoint, cfg.history_rate, clock,
                                   cfg.history_start_trace_s)
    info.update(planned_start_in_s=t0 - now, reload_predicted=nxt is not None)
    say(f"[history] {info['samples']} samples ({(info['end_wall_s'] - info['start_wall_s']):.0f} s, trace "
        f"{info['start_trace_s'] / 3600:.1f} h -> {info['end_trace_s'] / 3600:.1f} h) written into Prometheus; "
        f"replay starts in {t0 - now:.0f} s")
    # From the predicted reload on, poll until Prometheus shows the history (usually at once), then ask
    # for the rebuild right away: the operator's forecaster is rebuilt by the time the replay starts.
    await asyncio.sleep(max(0.0, t0 - 2.0 + 0.2 - time.time()))
    deadline = time.time() + cfg.history_timeout_s
    while True:
        n = await asyncio.to_thread(history_visible, cfg.prometheus_url, namespace, cfg.endpoint,
                                    info["start_wall_s"], min(time.time(), t0))
        if n or time.time() > deadline:
            break
        await asyncio.sleep(0.5)
    info["visible_points"] = n
    info["visible_at_s"] = time.time() - t0  # relative to the replay's start
    if not n:
        raise TimeoutError(f"Prometheus did not load the history block within {cfg.history_timeout_s:g} s "
                           f"after the planned start ({cfg.history.data_dir})")
    token = f"closedloop-{int(t0)}"
    await asyncio.to_thread(custom.patch_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, cfg.endpoint,
                            {"metadata": {"annotations": {REBUILD_ANNOTATION: token}}})
    info["rebuild_request"] = token
    return t0, info


async def run_mode(cfg: LoopConfig, mode: str, arrivals: Sequence[Arrival], watch: ReloadWatch | None = None,
                   request_s: float | None = None) -> dict:
    """One closed-loop run in a fresh namespace; returns its figures (and keeps raw data for the plot).
    `request_s`: aibrix mode's measured request time (aibrix_manifest)."""
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(cfg.kubeconfig))
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    namespace = f"closedloop-{mode}-{secrets.token_hex(3)}"
    say = cfg.progress or (lambda m: log.info("%s", m))
    await asyncio.to_thread(ensure_crd, api)
    await asyncio.to_thread(core.create_namespace, {"metadata": {"name": namespace, "labels": {"preheat.dev/experiment": "closedloop"}}})
    operator = OperatorProcess(cfg, namespace, mode, cfg.out_dir / f"operator-{mode}.log")
    target = f"closedloop-operator-{namespace}"
    sampler = Sampler(api, namespace, cfg.endpoint, cfg.sample_interval_s)
    result: dict[str, Any] = {"mode": mode, "namespace": namespace}
    t_mode = time.time()
    try:
        operator.start()
        if cfg.register_target:
            cfg.register_target(target, f"127.0.0.1:{operator.metrics_port}", {"job": "preheat-operator", "mode": mode})
        await asyncio.to_thread(custom.create_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL,
                                endpoint_manifest(cfg, mode))
        if mode in PEERS:
            result[mode] = peer_manifest(cfg, mode, namespace, request_s)
            await asyncio.to_thread(_PEER_API[mode].create, api, namespace, result[mode])
        want = cfg.min_replicas + (cfg.warm_pool_min if mode == "preheat" else 0)
        say(f"[{mode}] waiting for {want} Ready pod(s) in {namespace}")
        result["startup_s"] = await _wait_ready(cfg, core, namespace, want, operator)
        say(f"[{mode}] ready after {result['startup_s']:.0f} s; replaying {len(arrivals)} requests")

        replay_cfg = ReplayConfig(slo_s=cfg.slo_ms / 1000, queue_timeout_s=cfg.queue_timeout_s, stream=cfg.stream,
                                  max_duration_s=max(a.t_s for a in arrivals) + 1 if arrivals else 1)
        async with EndpointSliceWatcher(None, namespace, cfg.endpoint, port_name="http", api_client=api) as eps:
            replayer = Replayer(eps, replay_cfg)
            if cfg.history is not None:
                # returns at the replay's planned start, once the operator has been asked to rebuild
                t_start, result["history"] = await _install_history(cfg, custom, namespace, watch, say)
                await asyncio.sleep(max(0.0, t_start - time.time()))
            t0_wall = time.time()
            if "history" in result:
                result["history"]["start_late_s"] = t0_wall - t_start
            sampler.start(t0_wall)
            reporter = asyncio.create_task(_report(cfg, mode, replayer, sampler, say))
            try:
                records = await replayer.run(arrivals)
            finally:
                reporter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reporter
            await asyncio.to_thread(sampler.sample_once)
            await sampler.stop()
        t_end = max((r.done_s or 0) for r in records) if records else 0.0
        events = await asyncio.to_thread(_events, core, namespace, cfg.endpoint, t0_wall)
        scaler = None
        if mode in PEERS:
            result[f"{mode}_events"], result[f"{mode}_status"], scaler = await asyncio.to_thread(
                _peer_record, api, core, mode, namespace, result[mode]["metadata"]["name"], t0_wall, cfg.min_replicas)
        result.update(analyse(cfg, records, sampler.samples, arrivals, t_end, t0_wall, events, scaler))
        rebuilt = next((s.status.get("forecasterRebuild") for s in reversed(sampler.samples)
                        if s.status.get("forecasterRebuild")), None)
        if "history" in result:
            result["history"]["operator_rebuild"] = rebuilt
        result["operator_alive_at_end"] = operator.alive()
        # download + load per pod, as each model server reported it, beside creation -> Ready
        result["pod_cold_starts"] = await asyncio.to_thread(
            MS.pod_cold_starts, cfg.prometheus_url, namespace, cfg.endpoint, t_mode, M.cold_start_by_pod(sampler.samples))
        result["operator_cold_start_s"] = next((s.status.get("coldStartSeconds") for s in reversed(sampler.samples)
                                                if s.status.get("coldStartSeconds") is not None), None)
    finally:
        await sampler.stop()
        if mode in PEERS and mode in result:  # the peer's object, before the endpoint goes, so nothing scales what is being deleted
            with contextlib.suppress(Exception):
                await asyncio.to_thread(_PEER_API[mode].delete, api, namespace, result[mode]["metadata"]["name"])
        await _teardown(cfg, core, custom, namespace, operator)
        if cfg.unregister_target:
            with contextlib.suppress(Exception):
                cfg.unregister_target(target)
        api.close()
    return result


async def _report(cfg: LoopConfig, mode: str, replayer: Replayer, sampler: Sampler, say: Callable[[str], None]) -> None:
    """Live progress: one line every few seconds."""
    while True:
        await asyncio.sleep(cfg.progress_every_s)
        w = replayer.window_stats(10.0)
        s = sampler.samples[-1] if sampler.samples else None
        st = s.status if s else {}
        p99 = w["p99_latency_s"]
        slo = w["slo_attainment"]

        def num(v: Any) -> str:
            return "-" if v is None else f"{float(v):.1f}"

        say(
            f"[{mode}] t={w['t_s']:5.0f}s offered={w['offered_rps']:5.1f} rps  observed={num(st.get('observedSignal'))}"
            f"  forecast={num(st.get('forecastSignal'))}  serving={s.serving_ready if s else '-'}"
            f" warm={s.warm_ready if s else '-'} starting={s.starting if s else '-'}"
            f"  p99={'-' if p99 is None else f'{p99 * 1000:.0f}ms'}  slo={'-' if slo is None else f'{slo:.0%}'}"
        )


async def _teardown(cfg: LoopConfig, core: Any, custom: Any, namespace: str, operator: OperatorProcess) -> None:
    """Delete the endpoint (while the operator still runs), stop the operator, delete the namespace."""
    with contextlib.suppress(Exception):
        await asyncio.to_thread(custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, cfg.endpoint)
    t0 = time.monotonic()
    sel = f"preheat.dev/endpoint={cfg.endpoint}"
    while time.monotonic() - t0 < cfg.teardown_timeout_s:
        try:
            if not (await asyncio.to_thread(core.list_namespaced_pod, namespace, label_selector=sel)).items:
                break
        except Exception:
            break
        await asyncio.sleep(1.0)
    operator.stop()
    with contextlib.suppress(Exception):
        await asyncio.to_thread(core.delete_namespace, namespace)


def _events(core: Any, namespace: str, endpoint: str, t0_wall: float) -> list[dict]:
    """The operator's Events about the endpoint, on the experiment clock."""
    items = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={endpoint}").items
    out = []
    for e in items:
        when = e.event_time or e.last_timestamp or e.first_timestamp
        out.append({"t_s": when.timestamp() - t0_wall if when else None, "reason": e.reason, "message": e.message,
                    "reporting_instance": e.reporting_instance})
    return sorted((e for e in out if e["t_s"] is not None), key=lambda e: e["t_s"])


def analyse(cfg: LoopConfig, records: Sequence, samples: Sequence[M.Sample], arrivals: Sequence[Arrival],
            t_end: float, t0_wall: float, events: Sequence[dict] = (),
            scaler_decisions: Sequence[dict] | None = None) -> dict:
    """Every figure of one mode's run (JSON-able), plus the series the plot draws.

    `scaler_decisions`: when another autoscaler scales the endpoint (the peers' modes: its rescale
    Events, `hpa.rescale_decisions`), its decisions replace the operator's, which were only a preview."""
    summary = summarize(records, cfg.slo_ms / 1000, cfg.ttft_slo_ms / 1000 if cfg.stream else None)
    off_t, off_r = offered_rate(arrivals, 1.0)
    need_t, need = M.need_series(off_t, off_r, cfg.target_per_replica)
    proms = M.promotions(samples, cfg.interval_s + cfg.sample_interval_s)
    decs = decisions(samples, t0_wall) if scaler_decisions is None else list(scaler_decisions)
    reactions = M.reaction_times(decs, samples)
    rs = M.replica_seconds(samples, 0.0, t_end)
    lead = M.capacity_lead(samples, need_t, need, min_level=2)
    loaded_lead = M.capacity_lead(samples, need_t, need, min_level=2, loaded=True)
    vt, vc = M.violations_per_bin(records, 5.0, t_end)
    orders = M.serving_orders(events, decs) if scaler_decisions is None else M.serving_orders((), decs)
    cold = M.cold_start_seconds(samples)
    served = [r.done_s - r.sent_s for r in records if r.status == 200 and r.done_s is not None and r.sent_s is not None]
    return {
        "slo": summary,
        "slo_attainment": summary["slo_attainment"],
        "cold_start_waits": M.cold_start_waits(records, samples, need_t, need),
        # send -> answer of the requests served: the time a request spends in a replica (aibrix.py)
        "request_s_mean": float(np.mean(served)) if served else None,
        "request_s_count": len(served),
        "p50_latency_s": summary["p50_latency_s"],
        "p99_latency_s": summary["p99_latency_s"],
        "ttft_slo_attainment": summary.get("ttft_slo_attainment"),
        "ttft_p50_s": summary.get("ttft_p50_s"),
        "ttft_p99_s": summary.get("ttft_p99_s"),
        "replica_seconds": rs,
        "promotions": len(proms),
        "cold_starts_hidden": sum(1 for p in proms if p["hid_cold_start"]),
        "promotion_events": proms,
        "scale_up_reaction_s": [r["reaction_s"] for r in reactions],
        "scale_actions": scale_actions(events, scaler_decisions),
        "scale_ups": reactions,
        "decisions": decs,
        "capacity_lead": lead,
        "loaded_capacity_lead": loaded_lead,
        "serving_orders": orders,
        "forecast_lead": M.order_lead(lead, orders, cold),
        "cold_start_s": M.cold_start_seconds(samples),
        # pods created during the replay: each one a cold start, hidden or not
        "pods_started": len({p.uid for s in samples for p in s.pods if p.created_s >= 0}),
        "max_serving": max((s.serving_ready for s in samples), default=0),
        "metrics_available": any(
            c.get("type") == "MetricsAvailable" and c.get("status") == "True"
            for s in samples for c in (s.status.get("conditions") or [])
        ),
        "observed_rate_max": max((float(s.status.get("observedSignal") or 0) for s in samples), default=0.0),
        "series": {
            "offered_t": off_t.tolist(), "offered_rps": off_r.tolist(), "need": need.tolist(),
            "sample_t": [s.t_s for s in samples],
            "serving": [s.serving_ready for s in samples],
            "warm": [s.warm_ready for s in samples],
            "starting": [s.starting for s in samples],
            "observed": [_f(s.status.get("observedSignal")) for s in samples],
            "forecast": [_f(s.status.get("forecastSignal")) for s in samples],
            "violations_t": vt.tolist(), "violations": vc.tolist(),
        },
    }


def scale_actions(events: Sequence[dict], scaler_decisions: Sequence[dict] | None = None) -> int:
    """How many times the replica count was changed: the operator's ScaledUp/ScaledDown Events, or the
    other autoscaler's decisions (a repeated HPA Event counts each time)."""
    if scaler_decisions is not None:
        return sum(int(d.get("count") or 1) for d in scaler_decisions)
    return sum(1 for e in events if e.get("reason") in ("ScaledUp", "ScaledDown"))


def cold_start_headline(r: dict) -> dict:
    """Median and max cold start (creation -> Ready) and download of the run's pods, and the cold
    start the operator plans its lead time with (status.coldStartSeconds)."""
    def stats(xs: list) -> tuple[float | None, float | None]:
        xs = [float(x) for x in xs if x is not None]
        return (float(np.median(xs)), max(xs)) if xs else (None, None)

    rows = r.get("pod_cold_starts") or []
    cold = stats(r.get("cold_start_s") or [])
    download = stats([p.get("download_s") for p in rows])
    return {"cold_start_p50_s": cold[0], "cold_start_max_s": cold[1], "download_p50_s": download[0],
            "download_max_s": download[1], "operator_cold_start_s": r.get("operator_cold_start_s")}


def _f(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


@dataclass
class Comparison:
    modes: dict[str, dict] = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    workload: dict = field(default_factory=dict)

    def headline(self) -> dict:
        """Per mode: the numbers a reader compares first."""
        out = {}
        for mode, r in self.modes.items():
            leads = [x["lead_s"] for x in r.get("capacity_lead", [])]
            loaded = [x["lead_s"] for x in r.get("loaded_capacity_lead", [])]
            out[mode] = {
                "slo_attainment": r.get("slo_attainment"),
                "p50_latency_s": r.get("p50_latency_s"),
                "p99_latency_s": r.get("p99_latency_s"),
                "ttft_slo_attainment": r.get("ttft_slo_attainment"),
                "ttft_p50_s": r.get("ttft_p50_s"),
                "ttft_p99_s": r.get("ttft_p99_s"),
                "replica_seconds": r.get("replica_seconds", {}).get("total"),
                "promotions": r.get("promotions"),
                "cold_starts_hidden": r.get("cold_starts_hidden"),
                "mean_capacity_lead_s": float(np.mean(leads)) if leads else None,
                "mean_loaded_capacity_lead_s": float(np.mean(loaded)) if loaded else None,
                "max_serving": r.get("max_serving"),
                "scale_actions": r.get("scale_actions"),
                "pods_started": r.get("pods_started"),
                **cold_start_headline(r),
                "cold_start_waits": (r.get("cold_start_waits") or {}).get("requests"),
                "cold_start_waits_missed_slo": (r.get("cold_start_waits") or {}).get("missed_slo"),
                "forecast_orders_ahead": M.forecast_summary(r.get("forecast_lead", [])),
            }
        return out

    def to_json(self) -> dict:
        # the modes ran one after the other on the same arrivals (the machine has room for one at a time)
        return {"headline": self.headline(), "schedule": "back-to-back", "config": self.config,
                "workload": self.workload, "modes": self.modes}


async def compare(cfg: LoopConfig, arrivals: Sequence[Arrival], modes: Sequence[str] = MODES,
                  workload: dict | None = None) -> Comparison:
    """Run every mode on the same schedule, one after the other (back to back)."""
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    skip = {"register_target", "unregister_target", "progress", "kubeconfig"}
    conf = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name not in skip}
    conf = {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v) for k, v in conf.items()}
    skip_types = (HistoryWriter,)
    conf = {k: v for k, v in conf.items() if not isinstance(v, skip_types) and not callable(v)}
    comp = Comparison(config=conf, workload=workload or {})
    # Prometheus' block-reload timer, learned while the first mode's pods start (history only).
    watch = ReloadWatch(cfg.prometheus_url).start() if cfg.history is not None else None
    if "hpa" in modes:
        comp.config["hpa_adapter_rules"] = rules = cfg.hpa_rules()
        if cfg.start_hpa_metrics is not None:  # once: prometheus-adapter behind the custom metrics API
            comp.config["hpa_metrics"] = await asyncio.to_thread(cfg.start_hpa_metrics, rules)
    for mode in ("keda", "aibrix"):
        if mode in modes and cfg.start_peer is not None:  # once per run, before the first mode
            comp.config[f"{mode}_peer"] = await asyncio.to_thread(cfg.start_peer, mode)
    try:
        for mode in modes:
            request_s = None
            if mode == "aibrix":
                comp.config["aibrix_target"] = target = aibrix_target(cfg, list(comp.modes.values()))
                request_s = target["request_s"]
            comp.modes[mode] = await run_mode(cfg, mode, arrivals, watch, request_s)
    finally:
        if watch is not None:
            watch.stop()
    return comp


def aibrix_target(cfg: LoopConfig, earlier: Sequence[dict]) -> dict:
    """aibrix mode's target and where its request time came from: `cfg.aibrix_request_s` when set,
    else, where replicas are paced (`min_step_ms`), the answer time the step floor gives, else
    aibrix.DEFAULT_REQUEST_S (one unpaced replica load-tested at its per-replica rate, as a platform team
    sets a concurrency target). The mean request time of the run's earlier modes is recorded beside
    it, not used: it mixes in overload and more replicas sharing the CPU (aibrix.py)."""
    measured = A.request_seconds(earlier)
    if cfg.aibrix_request_s is not None:
        request_s, source = cfg.aibrix_request_s, "configured (--aibrix-request-s)"
    elif cfg.min_step_ms and cfg.mean_output_tokens:
        request_s = cfg.min_step_ms * cfg.mean_output_tokens / 1000
        source = "a paced replica's answer time: mean answer tokens x the step floor (no queueing)"
    else:
        request_s, source = A.DEFAULT_REQUEST_S, "one replica load-tested at the per-replica rate (aibrix.DEFAULT_REQUEST_S)"
    per_replica = hpa_per_replica(cfg)
    return {"per_replica_rps": per_replica, "request_s": request_s, "request_s_source": source,
            "running_per_replica": A.running_target(per_replica, request_s),
            "earlier_modes_request_s": measured[0] if measured else None,
            "earlier_modes_requests": measured[1] if measured else 0}
