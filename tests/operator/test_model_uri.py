"""model.uri: the spec's rules (pydantic and CEL say the same), and a failed download's way into status.

The init container's manifest is checked in test_builders.py, the fetcher itself in
tests/server/test_fetch.py; here a pod whose init container failed, as the API server reports it,
becomes Ready=False with preheat-fetch's own line as the message. The cluster test does it for real:
a store on the test's host, the operator, and the init container and the model server in a pod.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import threading
import urllib.request
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
from ophelpers import is_ready, kubectl, wait_for
from preheat.controller import actuation as a
from preheat.controller import crd
from preheat.controller import status as st
from preheat.controller.spec import describe_error, parse_spec
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

URI = "https://models.example.com/llama.tar.gz"
FETCH_ERROR = "preheat-fetch: GET https://models.example.com/llama.tar.gz: HTTP 404 Not Found"


def test_a_uri_model_is_valid_alone_and_with_checksum_and_cache():
    spec = parse_spec({"model": {"uri": URI, "sha256": "0a" * 32, "cacheOnNode": True}})
    assert spec.model.uri == URI and spec.model.cache_on_node is True
    assert spec.model.server_arg == "/model-store/model"
    assert parse_spec({"model": {"uri": "http://store.local/models/tiny/"}}).model.cache_on_node is False


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"uri": URI, "builtin": "tiny"}, "set exactly one of model.builtin (tiny, small, all-MiniLM-L6-v2), "
                                          "model.path or model.uri"),
        ({"uri": URI, "path": "/models/x"}, "set exactly one of model.builtin"),
        ({"uri": "s3://bucket/llama.tar.gz"}, "model.uri must start with http:// or https://"),
        ({"uri": "ftp://host/llama.tar.gz"}, "model.uri must start with http:// or https://"),
        ({"builtin": "tiny", "sha256": "0a" * 32}, "model.sha256 needs model.uri"),
        ({"uri": "http://store/tiny/", "sha256": "0a" * 32}, "a folder model.uri (ending in /) has none"),
        ({"builtin": "tiny", "cacheOnNode": True}, "model.cacheOnNode needs model.uri"),
        ({"uri": URI, "sha256": "not-hex"}, "model.sha256"),
        ({"uri": URI, "persistentVolumeClaim": "weights"}, "model.persistentVolumeClaim needs model.path"),
    ],
)
def test_bad_uri_specs_are_refused_with_a_reason(model, message):
    with pytest.raises(ValidationError) as err:
        parse_spec({"model": model})
    assert message in describe_error(err.value)


def test_the_crd_carries_the_same_rules_for_the_api_server():
    schema = crd.spec_schema()["properties"]["model"]
    messages = {r["message"] for r in schema["x-kubernetes-validations"]}
    assert "model.uri must start with http:// or https:// (other schemes are not supported)" in messages
    assert "model.cacheOnNode needs model.uri (only downloaded weights are cached)" in messages
    assert "model.sha256 needs model.uri (it checks the download)" in messages
    props = schema["properties"]
    assert props["uri"]["type"] == "string" and props["uri"]["maxLength"] == 4096
    assert props["sha256"]["pattern"] == "^[0-9a-f]{64}$"
    assert props["cacheOnNode"] == {**props["cacheOnNode"], "type": "boolean", "default": False}


def _pod_with_failed_fetch(state: dict, last: dict | None = None) -> dict:
    init = {"name": "fetch-model", "ready": False, "restartCount": 3, "state": state}
    if last is not None:
        init["lastState"] = {"terminated": last}
    return {
        "metadata": {"name": "llama-abc", "labels": {"preheat.dev/role": "warm"},
                     "creationTimestamp": "2026-12-03T18:00:00Z"},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "Ready", "status": "False"}],
            "initContainerStatuses": [init],
            "containerStatuses": [{"name": "model-server", "ready": False,
                                   "state": {"waiting": {"reason": "PodInitializing"}}}],
        },
    }


def test_a_crash_looping_fetch_is_a_failing_pod_with_the_fetchers_words():
    pod = _pod_with_failed_fetch({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
                                 {"exitCode": 1, "reason": "Error", "message": FETCH_ERROR + "\n"})
    view = a.pod_view(pod)
    assert view.failing and not view.ready
    assert view.failure == f"init container fetch-model: CrashLoopBackOff (exit code 1): {FETCH_ERROR}"
    assert a.count([view]).failing == 1 and a.count([view]).starting == 0
    cond = st.ready_condition(serving_ready=0, floor=1, failing=1, failure=view.failure)
    assert cond.status is False and cond.reason == "ModelServerFailing"
    assert "HTTP 404 Not Found" in cond.message and "fetch-model" in cond.message


def test_a_fetch_that_just_failed_is_failing_before_the_back_off():
    view = a.pod_view(_pod_with_failed_fetch({"terminated": {"exitCode": 1, "reason": "Error",
                                                             "message": FETCH_ERROR}}))
    assert view.failing and view.failure.endswith(FETCH_ERROR)


def test_a_fetch_still_downloading_or_done_is_not_failing():
    running = a.pod_view(_pod_with_failed_fetch({"running": {"startedAt": "2026-12-03T18:00:01Z"}}))
    assert not running.failing and a.count([running]).starting == 1
    done = _pod_with_failed_fetch({"terminated": {"exitCode": 0, "reason": "Completed"}})
    done["status"]["initContainerStatuses"][0]["ready"] = True
    assert not a.pod_view(done).failing


# ---- On the local cluster: a real init container and model server in a pod, a real HTTP store.

def _store(root):
    """A real http.server over `root` on every address of the test host; pods reach it through the one the
    API server advertises."""
    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    from preheat_cluster.realnode import API_SERVER_IP

    # A pod has its own loopback: it reaches the test's host through the address the API server advertises.
    httpd = ThreadingHTTPServer(("0.0.0.0", 0), partial(Quiet, directory=str(root)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://{API_SERVER_IP}:{httpd.server_address[1]}"


def _uri_endpoint(name: str, model: dict) -> dict:
    return {
        "apiVersion": "preheat.dev/v1alpha1",
        "kind": "InferenceEndpoint",
        "metadata": {"name": name},
        "spec": {
            "model": model,
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
            "server": {"maxNumSeqs": 2, "maxQueue": 4, "drainTimeoutSeconds": 1},
            "scaling": {"minReplicas": 1, "maxReplicas": 1, "warmPool": {"min": 0, "max": 0},
                        "intervalSeconds": 3},
        },
    }


@pytest.mark.cluster
def test_a_model_from_a_uri_serves_with_the_download_in_its_cold_start_and_a_bad_uri_says_why(
        operator_factory, cluster_view, namespace, crd_installed, tmp_path):
    from preheat_server.models.builtin import ensure_builtin

    root = tmp_path / "store"
    root.mkdir()
    with tarfile.open(root / "tiny.tar.gz", "w:gz") as tar:
        for f in sorted(ensure_builtin("tiny").iterdir()):
            tar.add(f, arcname=f.name)
    digest = hashlib.sha256((root / "tiny.tar.gz").read_bytes()).hexdigest()
    httpd, base = _store(root)
    try:
        cv = cluster_view
        op = operator_factory("--interval", "3")
        cv.create(_uri_endpoint("bad-uri", {"uri": f"{base}/missing.tar.gz"}))
        cv.create(_uri_endpoint("from-uri", {"uri": f"{base}/tiny.tar.gz", "sha256": digest}))

        def failing():
            c = cv.condition("bad-uri", "Ready")
            return c if c.get("status") == "False" and c.get("reason") == "ModelServerFailing" else None

        cond = wait_for(failing, 180, "bad-uri Ready=False/ModelServerFailing", op)
        assert "init container fetch-model" in cond["message"] and "HTTP 404" in cond["message"]
        # Kopf posts Events on its own, after the status patch: wait for it rather than read it at once
        warnings = wait_for(lambda: [e for e in cv.events("bad-uri") if e["reason"] == "ModelServerFailing"],
                            60, "a ModelServerFailing Event for bad-uri", op)
        assert warnings[0]["type"] == "Warning" and "HTTP 404" in warnings[0]["message"]

        wait_for(lambda: cv.condition("from-uri", "Ready").get("status") == "True", 300, "from-uri Ready=True", op)
        [pod] = [p for p in cv.live_pods("from-uri") if is_ready(p)]
        assert [c["name"] for c in pod["spec"]["initContainers"]] == ["fetch-model"]
        with urllib.request.urlopen(f"http://{pod['status']['podIP']}:8000/metrics", timeout=10) as r:
            samples = {s.name: s.value for fam in text_string_to_metric_families(r.read().decode())
                       for s in fam.samples}
        download, cold_start = samples["preheat:model_download_seconds"], samples["preheat:model_load_seconds"]
        assert download > 0 and cold_start > download
        # The operator's own measurement (pod creation -> Ready) spans the init container too.
        wait_for(lambda: (cv.status("from-uri").get("coldStartSeconds") or 0) > download, 60,
                 "status.coldStartSeconds covering the download", op)
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"uri": "s3://bucket/llama.tar.gz"}, "model.uri must start with http:// or https://"),
        ({"builtin": "tiny", "uri": "http://store/x.tar.gz"}, "model.path or model.uri"),
        ({"builtin": "tiny", "cacheOnNode": True}, "model.cacheOnNode needs model.uri"),
    ],
)
def test_the_api_server_refuses_a_bad_model_uri_with_the_same_words(crd_installed, namespace, model, message):
    body = _uri_endpoint("bad-model", model)
    proc = kubectl(crd_installed, "apply", "-n", namespace, "-f", "-", input=json.dumps(body), check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
