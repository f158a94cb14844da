"""The InferenceEndpoint CustomResourceDefinition, generated from the pydantic spec models.

`preheat crd` prints it; `crds/inferenceendpoint.yaml` is its committed output (a test keeps the two
equal). The converter turns pydantic's JSON Schema into a Kubernetes *structural* schema: no `$ref`,
no `anyOf` with null, int-or-string quantities, OpenAPI-v3 style exclusive minimums.
"""

from __future__ import annotations

import argparse
import copy
import sys
from typing import Any

import yaml

from preheat.controller.spec import (
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    InferenceEndpointSpec,
)

CRD_NAME = f"{PLURAL}.{GROUP}"

# Keys pydantic emits that a structural schema either forbids or does not need.
_DROP = {"title", "additionalProperties_false", "$defs"}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline `$ref`s recursively and normalise each node to structural-schema form."""
    if isinstance(node, list):
        return [_resolve(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        types = sorted(o.get("type", "") for o in options)
        if types == ["integer", "string"]:
            node["x-kubernetes-int-or-string"] = True
        elif len(options) == 1:
            merged = dict(options[0])
            merged.update(node)
            node = merged
        else:  # pragma: no cover - the spec models never produce this
            raise ValueError(f"cannot express anyOf {options} in a structural schema")
    # After anyOf: an optional sub-object (`X | None`) is an anyOf whose one non-null option is a $ref.
    if "$ref" in node:
        target = copy.deepcopy(defs[node.pop("$ref").rsplit("/", 1)[-1]])
        target.update(node)  # sibling keys (description, default) override the definition's
        node = target
    if node.get("x-kubernetes-int-or-string"):
        node.pop("type", None)
    if "default" in node and node["default"] is None:
        del node["default"]
    if isinstance(node.get("exclusiveMinimum"), int | float) and not isinstance(node["exclusiveMinimum"], bool):
        node["minimum"] = node["exclusiveMinimum"]
        node["exclusiveMinimum"] = True
    if node.get("additionalProperties") is False:
        del node["additionalProperties"]
    for key in ("title", "$defs"):
        node.pop(key, None)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("properties",):
            out[key] = {k: _resolve(v, defs) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _resolve(value, defs)
        else:
            out[key] = value
    return out


def spec_schema() -> dict[str, Any]:
    """The structural openAPIV3Schema of `.spec`, from the pydantic models."""
    raw = InferenceEndpointSpec.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    schema = _resolve(raw, defs)
    schema.pop("description", None)
    return schema


def status_schema() -> dict[str, Any]:
    """`.status` as the operator writes it (typed for the printer columns; the rest preserved)."""
    integer = {"type": "integer"}
    number = {"type": "number"}
    string = {"type": "string"}
    return {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {
            "observedGeneration": integer,
            "servingReplicas": integer,
            "warmReplicas": integer,
            "warmCostFraction": {**number, "description": "a warm replica's cost relative to a serving one "
                                 "(warmPool.costFraction, or from warmPool.resources)"},
            "replicaCost": {**number, "description": "servingReplicas + warmReplicas x warmCostFraction"},
            "desiredReplicas": integer,
            "readyReplicas": integer,
            "startingReplicas": integer,
            "failingReplicas": integer,
            "observedSignal": {**number, "description": "the scaling signal now (scaling.signal's unit)"},
            "forecastSignal": {**number, "description": "the signal forecast at now + lead time"},
            "forecastSignalUpper": {**number, "description": "its upper quantile (the forecast's safety margin)"},
            # v1alpha1's names of the three above, still written for one version.
            "observedRate": {**number, "description": "deprecated: observedSignal (goes in the next version)"},
            "forecastRate": {**number, "description": "deprecated: forecastSignal (goes in the next version)"},
            "forecastUpper": {**number, "description": "deprecated: forecastSignalUpper (goes in the next version)"},
            "leadTimeSeconds": number,
            "coldStartSeconds": number,
            "selector": string,
            "lastDecision": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "forecaster": {"type": "string", "description": "persisted forecaster + policy state (JSON)"},
            "conditions": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["type", "status"],
                    "properties": {
                        "type": string,
                        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                        "reason": string,
                        "message": string,
                        "lastTransitionTime": {"type": "string", "format": "date-time"},
                        "observedGeneration": integer,
                    },
                },
            },
        },
    }


PRINTER_COLUMNS = [
    {"name": "Serving", "type": "integer", "jsonPath": ".status.servingReplicas"},
    {"name": "Warm", "type": "integer", "jsonPath": ".status.warmReplicas"},
    {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredReplicas"},
    {"name": "Signal", "type": "number", "jsonPath": ".status.observedSignal", "description": "signal now"},
    {
        "name": "Forecast",
        "type": "number",
        "jsonPath": ".status.forecastSignal",
        "description": "signal forecast at now + lead time",
    },
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Mode", "type": "string", "jsonPath": ".spec.scaling.mode", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def build_crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/part-of": "preheat"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["preheat"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {
                        "status": {},
                        # `kubectl scale ie/x --replicas=N` (and an HPA) move the serving floor; the
                        # autoscaler still adds capacity above it.
                        "scale": {
                            "specReplicasPath": ".spec.scaling.minReplicas",
                            "statusReplicasPath": ".status.servingReplicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A model served by preheat-server replicas, scaled ahead of "
                            "forecast load with a warm pool of loaded replicas.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema(),
                                "status": status_schema(),
                            },
                        }
                    },
                }
            ],
        },
    }


def render() -> str:
    return "# Generated by `preheat crd` from preheat.controller.spec; do not edit by hand.\n" + yaml.safe_dump(
        build_crd(), sort_keys=False, width=120
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="preheat crd", description=__doc__)
    parser.add_argument("--out", help="write to this file instead of stdout")
    args = parser.parse_args(argv)
    text = render()
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
