"""The spec models and the CRD generated from them: defaults, readable errors, structural schema."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from preheat.controller import crd
from preheat.controller.spec import deprecated_fields, describe_error, parse_spec
from preheat.scaling.from_spec import policy_config
from pydantic import ValidationError

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "crds" / "samples"


def _spec(path: Path) -> dict:
    return yaml.safe_load(path.read_text())["spec"]


def test_committed_crd_is_the_generated_one():
    # `preheat crd --out crds/inferenceendpoint.yaml` regenerates it after a spec change.
    assert (ROOT / "crds" / "inferenceendpoint.yaml").read_text() == crd.render()


def test_defaults_fill_a_minimal_spec():
    spec = parse_spec({"model": {"builtin": "tiny"}})
    assert spec.scaling.min_replicas == 1 and spec.scaling.max_replicas == 10
    assert spec.scaling.warm_pool.min == 0 and spec.scaling.warm_pool.max == 2 and spec.scaling.warm_pool.cost_fraction is None and spec.warm_cost_fraction() == 1.0
    assert str(spec.scaling.mode) == "Auto"
    assert str(spec.scaling.signal) == "requestsPerSecond"
    assert spec.server.port == 8000


@pytest.mark.parametrize("sample", ["tiny-cpu.yaml", "llama-gpu.yaml", "missing-model-path.yaml"])
def test_good_samples_validate(sample):
    parse_spec(_spec(SAMPLES / sample))


BAD = {
    "bad-min-gt-max.yaml": "scaling.minReplicas must be <= scaling.maxReplicas",
    "bad-negative-target.yaml": "scaling.targetPerReplica must be > 0",
    "bad-accelerator.yaml": "accelerator.type",
}


@pytest.mark.parametrize(("sample", "message"), sorted(BAD.items()))
def test_bad_samples_rejected_with_readable_message(sample, message):
    with pytest.raises(ValidationError) as err:
        parse_spec(_spec(SAMPLES / sample))
    assert message in describe_error(err.value)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"model": {}}, "set exactly one of model.builtin"),
        ({"model": {"builtin": "tiny", "path": "/x"}}, "set exactly one of model.builtin"),
        ({"model": {"path": "relative/dir"}}, "absolute path"),
        ({"model": {"builtin": "all-MiniLM-L6-v2", "precision": "int8"}}, "does not apply to the embedding model"),
        ({"model": {"builtin": "tiny"}, "accelerator": {"type": "gpu"}}, "accelerator.count must be at least 1"),
        ({"model": {"builtin": "tiny"}, "scaling": {"warmPool": {"min": 3, "max": 1}}}, "warmPool.min must be <="),
        ({"model": {"builtin": "tiny"}, "scaling": {"latencySloMs": 0}}, "latency budget"),
        ({"model": {"builtin": "tiny"}, "scaling": {"minReplicas": 0}}, "scaleToZero"),
        ({"model": {"builtin": "tiny"}, "scaling": {"mode": "Yolo"}}, "mode"),
        ({"model": {"builtin": "tiny"}, "scaling": {"targetPerReplica": 0}}, "targetPerReplica must be > 0"),
        ({"model": {"builtin": "tiny"}, "scaling": {"targetUtilization": 0}}, "scaling.targetUtilization"),
        ({"model": {"builtin": "tiny"}, "scaling": {"targetUtilization": 1.2}}, "less than or equal to 1"),
        ({"model": {"builtin": "tiny"}, "scaling": {"forecasting": {"horizonSeconds": 40, "leadTimeSeconds": 40}}},
         "set leadTimeSeconds, or its old spelling horizonSeconds, not both"),
    ],
)
def test_cross_field_rules(spec, message):
    with pytest.raises(ValidationError) as err:
        parse_spec(spec)
    assert message in describe_error(err.value)


def _server(**server) -> dict:
    return {"model": {"builtin": "tiny"}, "server": server}


@pytest.mark.parametrize(
    "ref", [{"name": "chat-api", "key": "token"}, {"name": "team.chat-api", "key": "API_KEY.v2"},
            {"name": "a", "key": "-"}],
)
def test_api_key_secret_accepts_kubernetes_names(ref):
    spec = parse_spec(_server(apiKeySecret=ref, env={"LOG_LEVEL": "debug"}))
    assert (spec.server.api_key_secret.name, spec.server.api_key_secret.key) == (ref["name"], ref["key"])
    assert parse_spec(_server()).server.api_key_secret is None


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"apiKeySecret": {"name": "", "key": "token"}}, "server.apiKeySecret.name must be a Secret name"),
        ({"apiKeySecret": {"name": "Chat_API", "key": "token"}}, "(got 'Chat_API')"),
        ({"apiKeySecret": {"name": "chat-", "key": "token"}}, "server.apiKeySecret.name must be"),
        ({"apiKeySecret": {"name": "x" * 254, "key": "token"}}, "server.apiKeySecret.name"),
        ({"apiKeySecret": {"name": "chat-api", "key": ""}}, "server.apiKeySecret.key must be a Secret key"),
        ({"apiKeySecret": {"name": "chat-api", "key": "a/b"}}, "(got 'a/b')"),
        ({"apiKeySecret": {"name": "chat-api"}}, "server.apiKeySecret.key: Field required"),
        ({"apiKeySecret": {"key": "token"}}, "server.apiKeySecret.name: Field required"),
        ({"apiKeySecret": {"name": "chat-api", "key": "token", "optional": True}}, "optional"),
        ({"apiKeySecret": {"name": "chat-api", "key": "token"}, "env": {"PREHEAT_API_KEY": "s3cret"}},
         "server.env sets PREHEAT_API_KEY and server.apiKeySecret sets it too"),
    ],
)
def test_api_key_secret_rejects_bad_references_saying_why(server, message):
    with pytest.raises(ValidationError) as err:
        parse_spec(_server(**server))
    assert message in describe_error(err.value)


def test_api_key_secret_cel_rules_use_the_same_patterns_as_pydantic():
    # The CRD's CEL rules match the same names as the pydantic validator (the API server runs RE2; these
    # patterns use no feature where RE2 and Python's re differ).
    from preheat.controller.spec import SECRET_KEY, SECRET_NAME

    server = crd.spec_schema()["properties"]["server"]
    ref = server["properties"]["apiKeySecret"]
    assert set(ref["required"]) == {"name", "key"}
    rules = [r["rule"] for r in ref["x-kubernetes-validations"]]
    assert f"self.name.matches('{SECRET_NAME}')" in rules and f"self.key.matches('{SECRET_KEY}')" in rules
    assert any("PREHEAT_API_KEY" in r["rule"] for r in server["x-kubernetes-validations"])


def _walk(node, path="spec"):
    yield path, node
    for key, child in (node.get("properties") or {}).items():
        yield from _walk(child, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural():
    # Structural: every node has a type (or is int-or-string), no $ref/anyOf/title left over.
    schema = crd.spec_schema()
    for path, node in _walk(schema):
        assert "$ref" not in node and "anyOf" not in node, path
        assert node.get("type") or node.get("x-kubernetes-int-or-string"), path
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, path


def test_cel_rules_mirror_pydantic_messages():
    # Every CEL message is also a pydantic message (spec.py raises the same strings), so the API
    # server and the operator explain a bad spec in the same words.
    source = (ROOT / "operator" / "preheat" / "controller" / "spec.py").read_text()
    rules = [rule for _, node in _walk(crd.spec_schema()) for rule in node.get("x-kubernetes-validations", [])]
    assert len(rules) >= 8
    for rule in rules:
        assert source.count(rule["message"]) >= 2 or rule["message"].startswith("model.path must"), rule


def test_crd_has_subresources_columns_and_short_names():
    body = crd.build_crd()
    version = body["spec"]["versions"][0]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"]["statusReplicasPath"] == ".status.servingReplicas"
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    for column in ("Serving", "Warm", "Desired", "Signal", "Forecast", "Ready", "Age"):
        assert column in names
    assert "ie" in body["spec"]["names"]["shortNames"]


def test_crd_main_prints_yaml(capsys):
    assert crd.main([]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["metadata"]["name"] == "inferenceendpoints.preheat.dev"


def test_the_old_spelling_of_lead_time_still_parses_to_the_same_spec():
    # v1alpha1 renamed scaling.forecasting.horizonSeconds to leadTimeSeconds; the old spelling is read as
    # the new one for this version (and the reconcile handler posts a DeprecatedField Warning Event).
    old = {"model": {"builtin": "tiny"}, "scaling": {"forecasting": {"horizonSeconds": 45}}}
    new = {"model": {"builtin": "tiny"}, "scaling": {"forecasting": {"leadTimeSeconds": 45}}}
    assert parse_spec(old) == parse_spec(new)
    assert parse_spec(old).scaling.forecasting.lead_time_seconds == 45.0
    assert policy_config(parse_spec(old)) == policy_config(parse_spec(new))
    assert policy_config(parse_spec(new)).horizon_override_s == 45.0
    assert parse_spec(new) != parse_spec({"model": {"builtin": "tiny"}})
    schema = crd.spec_schema()["properties"]["scaling"]["properties"]["forecasting"]["properties"]
    assert {"horizonSeconds", "leadTimeSeconds"} <= set(schema)  # the API server still stores both


def test_deprecated_fields_are_named_with_where_they_went():
    raw = {"model": {"builtin": "tiny"},
           "scaling": {"latencySloMs": 3000, "forecasting": {"horizonSeconds": 45}},
           "prometheus": {"queries": {"latency": "up"}}}
    parse_spec(raw)  # still accepted in v1alpha1
    messages = deprecated_fields(raw)
    assert len(messages) == 3
    assert any("spec.scaling.forecasting.horizonSeconds" in m and "leadTimeSeconds" in m for m in messages)
    assert any("spec.scaling.latencySloMs" in m and "ignored" in m for m in messages)
    assert any("spec.prometheus.queries.latency" in m for m in messages)
    assert deprecated_fields({"model": {"builtin": "tiny"}, "scaling": {"forecasting": {"leadTimeSeconds": 45}}}) == []
    assert deprecated_fields(None) == []
