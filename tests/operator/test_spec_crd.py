"""The spec models and the CRD generated from them: defaults, readable errors, structural schema."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from preheat.controller import crd
from preheat.controller.spec import describe_error, parse_spec
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
    assert spec.scaling.warm_pool.min == 0 and spec.scaling.warm_pool.max == 2 and spec.scaling.warm_pool.cost_fraction == 1.0
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
    ],
)
def test_cross_field_rules(spec, message):
    with pytest.raises(ValidationError) as err:
        parse_spec(spec)
    assert message in describe_error(err.value)


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
    for column in ("Serving", "Warm", "Desired", "Rate", "Forecast", "Ready", "Age"):
        assert column in names
    assert "ie" in body["spec"]["names"]["shortNames"]


def test_crd_main_prints_yaml(capsys):
    assert crd.main([]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["metadata"]["name"] == "inferenceendpoints.preheat.dev"
