"""Manifest builders: labels per ARCHITECTURE.md, probes, drain, owner references, server flags."""

from __future__ import annotations

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
