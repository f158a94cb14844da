"""Renders the InferenceEndpoint CRD's schema as the README's field reference (Markdown).

`python scripts/crd_reference.py` prints it; `--write README.md` replaces the block between the
`<!-- crd-reference -->` markers. A test keeps the README equal to this output, so the reference is
always the schema the API server enforces.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CRD = ROOT / "crds" / "inferenceendpoint.yaml"
BEGIN, END = "<!-- crd-reference -->", "<!-- /crd-reference -->"


def _type(schema: dict) -> str:
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    t = schema.get("type", "object")
    if t == "array":
        return f"[]{_type(schema.get('items', {}))}"
    if schema.get("x-kubernetes-int-or-string"):
        return "int or string"
    return t


def _limits(schema: dict) -> str:
    # OpenAPI v3 spells an exclusive minimum as `minimum` plus `exclusiveMinimum: true`.
    low = ">" if schema.get("exclusiveMinimum") is True else "≥"
    parts = []
    for key, word in (("minimum", low), ("maximum", "≤"), ("exclusiveMinimum", ">")):
        if key in schema and not isinstance(schema[key], bool):
            parts.append(f"{word} {schema[key]}")
    return ", ".join(parts)


def _rows(schema: dict, prefix: str) -> list[str]:
    rows = []
    required = set(schema.get("required", []))
    for name, sub in schema.get("properties", {}).items():
        path = f"{prefix}.{name}" if prefix else name
        default = sub.get("default")
        # Object defaults are the sums of their fields' defaults, listed on those rows.
        default_s = "" if default is None or isinstance(default, dict) else f"`{json.dumps(default)}`"
        desc = " ".join(str(sub.get("description", "")).split()).replace("|", "\\|")
        limits = _limits(sub)
        if limits:
            desc = f"{desc} ({limits})" if desc else f"({limits})"
        req = " (required)" if name in required else ""
        rows.append(f"| `{path}`{req} | {_type(sub)} | {default_s} | {desc} |")
        if sub.get("type") == "object" and "properties" in sub:
            rows += _rows(sub, path)
        elif sub.get("type") == "array" and "properties" in sub.get("items", {}):
            rows += _rows(sub["items"], f"{path}[]")
    return rows


def _rules(schema: dict, prefix: str) -> list[str]:
    out = []
    for rule in schema.get("x-kubernetes-validations", []):
        out.append(f"- `{prefix or 'spec'}`: {rule.get('message', rule['rule'])}")
    for name, sub in schema.get("properties", {}).items():
        out += _rules(sub, f"{prefix}.{name}" if prefix else name)
    return out


def render() -> str:
    crd = yaml.safe_load(CRD.read_text())
    version = crd["spec"]["versions"][0]
    root = version["schema"]["openAPIV3Schema"]["properties"]
    lines = [BEGIN, "", f"`{crd['spec']['group']}/{version['name']}`, kind `{crd['spec']['names']['kind']}`"
             f" (short names {', '.join(crd['spec']['names'].get('shortNames', []))}). Generated from"
             " `crds/inferenceendpoint.yaml` by `scripts/crd_reference.py`.", ""]
    for section in ("spec", "status"):
        if section not in root:
            continue
        lines += [f"**{section}**", "", "| field | type | default | meaning |", "|---|---|---|---|"]
        lines += _rows(root[section], section)
        lines.append("")
    rules = _rules(root["spec"], "spec")
    if rules:
        lines += ["Validation rules the API server enforces (CEL), with the message `kubectl apply` shows:", ""]
        lines += [*rules, ""]
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", type=Path, help="replace the marked block in this file")
    args = parser.parse_args(argv)
    text = render()
    if not args.write:
        print(text)
        return 0
    doc = args.write.read_text()
    start, end = doc.index(BEGIN), doc.index(END) + len(END)
    args.write.write_text(doc[:start] + text + doc[end:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
