"""Manifest builders: labels per ARCHITECTURE.md, probes, drain, owner references, server flags."""

from __future__ import annotations

import pytest
from preheat.controller import builders as b
from preheat.controller.spec import parse_spec

OWNER = {
    "apiVersion": "preheat.dev/v1alpha1",
    "kind": "InferenceEndpoint",
    "metadata": {"name": "chat", "namespace": "team", "uid": "1234"},
}


def _spec(**over):
    raw = {"model": {"builtin": "tiny"}, "server": {"maxNumSeqs": 4, "maxQueue": 16}}
    raw.update(over)
    return parse_spec(raw)


def test_deployment_selector_never_has_role_but_template_starts_warm():
    dep = b.deployment("chat", "team", _spec(), OWNER, replicas=2, version="9.9")
    selector = dep["spec"]["selector"]["matchLabels"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert b.LABEL_ROLE not in selector
    assert labels[b.LABEL_ROLE] == b.ROLE_WARM
    assert all(labels[k] == v for k, v in selector.items())
    assert labels["app.kubernetes.io/managed-by"] == "preheat"
    assert dep["spec"]["replicas"] == 2
    assert dep["metadata"]["ownerReferences"][0]["uid"] == "1234"
    assert dep["metadata"]["ownerReferences"][0]["controller"] is True


def test_container_flags_probes_and_drain():
    dep = b.deployment("chat", "team", _spec(), OWNER, version="9.9")
    assert "replicas" not in dep["spec"]  # the loop owns replicas after creation
    pod = dep["spec"]["template"]
    c = pod["spec"]["containers"][0]
    assert c["image"] == "preheat/model-server:9.9"
    args = c["args"]
    flag = {args[i]: args[i + 1] for i in range(0, len(args) - 1) if args[i].startswith("--")}
    assert flag["--model"] == "tiny"
    assert flag["--host"] == "$(POD_IP)"
    assert flag["--max-num-seqs"] == "4" and flag["--max-queue"] == "16"
    assert flag["--served-model-name"] == "chat"
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in c["env"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health/live"
    assert pod["spec"]["terminationGracePeriodSeconds"] > 30  # drain 30 s + preStop
    ann = pod["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/port"] == "8000"
    assert ann[b.DELETION_COST] == b.COST_WARM


def test_gpu_image_resources_and_pvc():
    spec = parse_spec(
        {
            "model": {"path": "/models/llama", "persistentVolumeClaim": "weights", "precision": "bf16"},
            "accelerator": {"type": "gpu", "count": 2, "nodeSelector": {"gpu": "h100"},
                            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]},
        }
    )
    pod = b.pod_template("llama", spec, version="1.0")
    c = pod["spec"]["containers"][0]
    assert c["image"] == "preheat/model-server-cuda:1.0"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert "--device" in c["args"] and c["args"][c["args"].index("--device") + 1] == "cuda"
    assert c["args"][c["args"].index("--precision") + 1] == "bf16"
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "weights"
    assert c["volumeMounts"][0]["mountPath"] == "/models"
    assert pod["spec"]["nodeSelector"] == {"gpu": "h100"}
    assert pod["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]


def test_service_and_pdb_select_serving_pods_only():
    svc = b.service("chat", "team", _spec(), OWNER)
    pdb = b.pod_disruption_budget("chat", "team", _spec(), OWNER)
    assert svc["spec"]["selector"][b.LABEL_ROLE] == b.ROLE_SERVING
    assert pdb["spec"]["selector"]["matchLabels"][b.LABEL_ROLE] == b.ROLE_SERVING
    assert svc["spec"]["ports"][0]["targetPort"] == "http"


def test_spec_change_changes_template_only_when_the_server_changes():
    base = b.pod_template("chat", _spec(), version="1")
    scaled = b.pod_template("chat", _spec(scaling={"maxReplicas": 50}), version="1")
    tuned = b.pod_template("chat", _spec(server={"maxNumSeqs": 8}), version="1")
    assert base == scaled  # scaling knobs never roll the pods
    assert base != tuned  # server knobs do


def test_initial_replicas_is_floor_plus_warm_pool():
    assert b.initial_replicas(_spec(scaling={"minReplicas": 2, "warmPool": {"min": 1, "max": 3}})) == 3
    assert b.initial_replicas(_spec(scaling={"minReplicas": 2, "maxReplicas": 2})) == 2


URI = "https://models.example.com/llama.tar.gz"


def _uri_spec(**model):
    return parse_spec({"model": {"uri": URI, **model}, "resources": {"requests": {"cpu": "2", "memory": "4Gi"}},
                       "accelerator": {"type": "gpu", "count": 1}})


def test_model_uri_is_fetched_by_a_restricted_init_container_into_a_shared_volume():
    digest = "ab" * 32
    pod = b.pod_template("llama", _uri_spec(sha256=digest), version="1.0")
    spec = pod["spec"]
    [init] = spec["initContainers"]
    server = spec["containers"][0]
    assert init["name"] == b.FETCH_CONTAINER and init["image"] == server["image"]
    assert init["command"] == ["preheat-fetch"]
    assert init["args"] == [URI, "/model-store/model", "--record", b.FETCH_RECORD, "--sha256", digest]
    # The server loads what the init container wrote, from the same volume, read-only.
    assert server["args"][server["args"].index("--model") + 1] == "/model-store/model"
    assert spec["volumes"] == [{"name": b.MODEL_STORE_VOLUME, "emptyDir": {}}, {"name": b.TMP_VOLUME, "emptyDir": {}}]
    assert init["volumeMounts"] == [{"name": b.MODEL_STORE_VOLUME, "mountPath": "/model-store"}]
    assert server["volumeMounts"] == [{"name": b.MODEL_STORE_VOLUME, "mountPath": "/model-store", "readOnly": True},
                                      {"name": b.TMP_VOLUME, "mountPath": "/tmp"}]
    assert {"name": "PREHEAT_FETCH_RECORD", "value": b.FETCH_RECORD} in server["env"]
    # Restricted Pod Security Standard, container level (and a read-only root filesystem).
    sc = init["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert init["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # The download gets the server's CPU and memory, never its GPUs.
    assert init["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}}
    assert server["resources"]["limits"]["nvidia.com/gpu"] == "1"


@pytest.mark.parametrize("model", [{"builtin": "tiny"}, {"persistentVolumeClaim": "weights", "path": "/models/m"}])
def test_the_server_container_is_restricted_and_writes_only_to_tmp(model):
    """Admitted by the restricted Pod Security Standard; a read-only root filesystem, so the caches the image
    points at /tmp land on an emptyDir, beside whatever volume the model comes from."""
    spec = b.pod_template("ep", parse_spec({"model": model}))["spec"]
    server = spec["containers"][0]
    sc = server["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == b.IMAGE_UID
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {"name": b.TMP_VOLUME, "mountPath": "/tmp"} in server["volumeMounts"]
    assert {"name": b.TMP_VOLUME, "emptyDir": {}} in spec["volumes"]
    # The model's own volume is still there (the tmp volume is added, never replaces it).
    assert len(spec["volumes"]) == (2 if "persistentVolumeClaim" in model else 1)


def test_cache_on_node_mounts_the_node_cache_in_both_containers():
    pod = b.pod_template("llama", _uri_spec(cacheOnNode=True), version="1.0")
    spec = pod["spec"]
    init, server = spec["initContainers"][0], spec["containers"][0]
    assert init["args"][-2:] == ["--cache-dir", b.NODE_CACHE_DIR]
    cache = {"name": b.MODEL_CACHE_VOLUME, "hostPath": {"path": b.NODE_CACHE_DIR, "type": "DirectoryOrCreate"}}
    assert cache in spec["volumes"]
    # The store holds a symlink into the cache: the server must see the cache at the same path.
    assert {"name": b.MODEL_CACHE_VOLUME, "mountPath": b.NODE_CACHE_DIR, "readOnly": True} in server["volumeMounts"]
    assert {"name": b.MODEL_CACHE_VOLUME, "mountPath": b.NODE_CACHE_DIR} in init["volumeMounts"]


def test_builtin_and_path_models_have_no_init_container():
    for spec in (_spec(), parse_spec({"model": {"path": "/models/x", "persistentVolumeClaim": "w"}})):
        pod = b.pod_template("chat", spec, version="1")
        assert "initContainers" not in pod["spec"]
        env = pod["spec"]["containers"][0]["env"]
        assert all(e["name"] != "PREHEAT_FETCH_RECORD" for e in env)


def _env(spec) -> dict[str, dict]:
    c = b.deployment("chat", "team", spec, OWNER, version="9.9")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e for e in c["env"]}


def test_api_key_secret_becomes_the_servers_key_env_from_the_secret():
    spec = _spec(server={"apiKeySecret": {"name": "chat-api", "key": "token"}, "env": {"LOG_LEVEL": "debug"}})
    env = _env(spec)
    assert env["PREHEAT_API_KEY"] == {
        "name": "PREHEAT_API_KEY", "valueFrom": {"secretKeyRef": {"name": "chat-api", "key": "token"}}}
    assert env["LOG_LEVEL"] == {"name": "LOG_LEVEL", "value": "debug"}  # server.env still applies
    # The key reaches the server only through the kubelet: never as a flag in the Deployment.
    args = b.server_args("chat", spec)
    assert "--api-key" not in args and "token" not in args


def test_no_api_key_secret_no_key_env():
    assert "PREHEAT_API_KEY" not in _env(_spec())


def test_probes_and_metrics_scrape_use_paths_the_server_leaves_open_with_a_key():
    # With server.apiKeySecret the probes and Prometheus carry no key: their paths must be the server's
    # open ones (preheat_server.http.app), or every pod would go unready and unscraped.
    from preheat_server.http.app import OPEN_PATHS, OPEN_PREFIXES

    spec = _spec(server={"apiKeySecret": {"name": "chat-api", "key": "token"}})
    pod = b.deployment("chat", "team", spec, OWNER, version="9.9")["spec"]["template"]
    c = pod["spec"]["containers"][0]
    paths = [c["readinessProbe"]["httpGet"]["path"], c["livenessProbe"]["httpGet"]["path"],
             pod["metadata"]["annotations"]["prometheus.io/path"]]
    for path in paths:
        assert path in OPEN_PATHS or path.startswith(OPEN_PREFIXES), path


def test_replicas_spread_over_nodes_without_ever_waiting_for_it():
    spec = b.pod_template("ep", parse_spec({"model": {"builtin": "tiny"}}))["spec"]
    [spread] = spec["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["maxSkew"] == 1
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    # The same pods the Deployment owns: warm and serving alike.
    assert spread["labelSelector"]["matchLabels"] == b.selector_labels("ep")
