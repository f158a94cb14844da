"""Kopf peering on the local cluster: two `preheat operator` processes with the same peering name and
different priorities against one endpoint. Only the higher-priority one acts; when it is killed the
other takes over and converges, and nothing is done twice.

Kopf's semantics (docs.kopf.dev, "Peering"; kopf/_core/engines/peering.py): operators sharing a
peering object write keep-alives into its status; one that sees a live peer of higher priority pauses
(its watches stop and its daemons are stopped), and with a named (mandatory) peering it starts paused
until it has read the peers. A peer that stops writing is dead once its lifetime passes. Each process
here has its own identity, which it writes into the Events it posts (`reportingInstance`) and into
`.status.operator` on every loop step, so what each one did can be told apart.
"""

from __future__ import annotations

import datetime as dt
import re
import time

import pytest
from ophelpers import ROOT, kubectl, lightweight_endpoint, ready_by_role, role, wait_for

pytestmark = [pytest.mark.cluster]

PEERING_CRD = ROOT / "manifests" / "chart" / "preheat" / "crds" / "kopf-peering.yaml"
PEERING = "preheat-peering-test"


def _reconciles(metrics_text: str) -> float:
    """Reconciles and autoscale steps this process ran (preheat_reconcile_total and
    preheat_autoscale_steps_total, every outcome)."""
    pattern = r'^preheat_(?:reconcile|autoscale_steps)_total\{[^}]*\} ([0-9.e+]+)$'
    return sum(float(v) for v in re.findall(pattern, metrics_text, re.M))


def _operator_events(cv, name: str) -> list[dict]:
    """Events about the InferenceEndpoint itself (its Deployment and Service share the name; their
    Events come from the controllers, not from an operator)."""
    return [e for e in cv.events(name) if e["involvedObject"].get("kind") == "InferenceEndpoint"]


def _when(event: dict) -> float:
    t = event.get("eventTime") or event.get("lastTimestamp") or event.get("firstTimestamp")
    return dt.datetime.fromisoformat(str(t).replace("Z", "+00:00")).timestamp()


def _peers(cv, namespace: str) -> dict:
    obj = cv.custom.get_namespaced_custom_object("kopf.dev", "v1", namespace, "kopfpeerings", PEERING)
    return obj.get("status") or {}


def test_peering_only_the_higher_priority_operator_acts_and_the_other_takes_over(
        operator_factory, cluster_view, namespace, crd_installed):
    cv, name = cluster_view, "peered"
    # Kopf's peering CRDs, as the chart installs them, and this namespace's peering object.
    kubectl(crd_installed, "apply", "-f", str(PEERING_CRD))
    kubectl(crd_installed, "wait", "--for", "condition=Established", "--timeout=60s",
            "crd/kopfpeerings.kopf.dev", "crd/clusterkopfpeerings.kopf.dev")
    cv.custom.create_namespaced_custom_object("kopf.dev", "v1", namespace, "kopfpeerings", {
        "apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": PEERING}})

    peering = ("--peering", PEERING, "--peering-lifetime", "15", "--interval", "2")
    high = operator_factory(*peering, "--priority", "100", "--identity", "op-high")
    wait_for(lambda: "op-high" in _peers(cv, namespace), 60, "op-high's keep-alive in the peering object", high)
    low = operator_factory(*peering, "--priority", "10", "--identity", "op-low")
    wait_for(lambda: "op-low" in _peers(cv, namespace), 60, "op-low's keep-alive in the peering object", low)
    assert _peers(cv, namespace)["op-high"]["priority"] == 100 and _peers(cv, namespace)["op-low"]["priority"] == 10

    cv.create(lightweight_endpoint(name, minReplicas=1, maxReplicas=6, warmPool={"min": 1, "max": 1}))

    def settled(serving: int, acting: str):
        def check():
            st = cv.status(name)
            pods = cv.live_pods(name)
            s, w = ready_by_role(pods)
            dep = cv.apps.read_namespaced_deployment(name, namespace)
            ok = (len(s) == serving and len(w) == 1 and len(pods) == serving + 1
                  and dep.spec.replicas == serving + 1 and st.get("operator") == acting
                  and st.get("servingReplicas") == serving)
            return (st, pods) if ok else None
        return check

    wait_for(settled(1, "op-high"), 120, "1 serving + 1 warm, written by op-high", high)
    kubectl(crd_installed, "scale", "-n", namespace, f"ie/{name}", "--replicas=2")
    wait_for(settled(2, "op-high"), 120, "2 serving + 1 warm, written by op-high", high)

    # Mutual exclusion while both run: everything about the endpoint came from op-high; op-low paused
    # in its favour and never ran a reconcile or a loop step.
    time.sleep(6)  # a few more of op-high's loop steps with op-low alive beside it
    events = _operator_events(cv, name)
    assert {e.get("reportingInstance") for e in events} == {"op-high"}, [
        (e.get("reportingInstance"), e["reason"]) for e in events]
    assert any(e["reason"] == "Promoted" for e in events)
    assert _reconciles(high.metrics_text()) > 0
    assert _reconciles(low.metrics_text()) == 0, low.metrics_text()
    assert cv.status(name)["operator"] == "op-high"

    # op-high dies without a word (SIGKILL: no goodbye in the peering object). Once its keep-alive is
    # older than its lifetime, op-low resumes, picks the endpoint up where it was, and converges.
    t_kill = time.time()
    high.kill()
    wait_for(lambda: cv.status(name).get("operator") == "op-low", 120, "op-low acting after op-high died", low)
    kubectl(crd_installed, "scale", "-n", namespace, f"ie/{name}", "--replicas=3")
    _, pods = wait_for(settled(3, "op-low"), 120, "3 serving + 1 warm, written by op-low", low)
    assert _reconciles(low.metrics_text()) > 0

    # Nothing doubled: 4 pods for 4 replicas, every serving pod promoted once, and every Event after the
    # takeover is op-low's.
    time.sleep(4)
    events = _operator_events(cv, name)
    after = [e for e in events if _when(e) > t_kill + 1.0]
    assert {e.get("reportingInstance") for e in events} == {"op-high", "op-low"}
    assert after and {e.get("reportingInstance") for e in after} == {"op-low"}, [
        (e.get("reportingInstance"), e["reason"], _when(e) - t_kill) for e in after]
    promoted: dict[str, int] = {}
    for e in events:
        if e["reason"] == "Promoted":
            for pod in re.findall(r"promoted warm pod\(s\) (.+?) to serving", e["message"])[0].split(", "):
                promoted[pod] = promoted.get(pod, 0) + (e.get("count") or 1)
    serving_now = {p["metadata"]["name"] for p in pods if role(p) == "serving"}
    assert serving_now <= set(promoted), (serving_now, promoted)
    assert all(n == 1 for n in promoted.values()), promoted
    assert len(cv.live_pods(name)) == 4 and cv.apps.read_namespaced_deployment(name, namespace).spec.replicas == 4
