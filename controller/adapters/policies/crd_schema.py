"""The TailguardPolicy CRD (tailguard.io/v1alpha1), generated from the policy models like rules/schema.json.

`spec` is the policy document (controller/core/policy.py) with `apiVersion`, `kind` and `name` optional (the
custom resource carries the first two; the policy's name is `metadata.name` unless `spec.name`). The pydantic
JSON Schema is made *structural*, as the API server requires of a CRD schema:

- every `$ref` is resolved inline; `const` becomes a one-value `enum`; `$schema`, `$id`, `title`, `default`,
  `discriminator`, `propertyNames` and `additionalProperties: false` are dropped (the API server prunes or
  rejects unknown fields itself; what the schema cannot say, the controller checks and reports in the status);
- `X | None` becomes `X` with `nullable: true`;
- a duration (`"30s"` or seconds) and `for` (a count or a duration) become `x-kubernetes-int-or-string`: in a
  custom resource a duration in seconds is a whole number (`0.5` is written `500ms`);
- the six action types (a union tagged by `type`) become one object: `type` an enum, the union of their fields.
  Which fields an action type takes is checked by the controller (reported in the status, the last good version
  keeps running).

`x-kubernetes-preserve-unknown-fields` appears nowhere.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from tailguard.controller.core.policy import policy_json_schema
from tailguard.controller.kit.errors import ConfigError

GROUP = "tailguard.io"
VERSION = "v1alpha1"
KIND = "TailguardPolicy"
PLURAL = "tailguardpolicies"
SINGULAR = "tailguardpolicy"
SHORT_NAMES = ["tgp"]

_READY_PATH = '.status.conditions[?(@.type=="Ready")].status'
_DROPPED = {"$schema", "$id", "title", "default", "discriminator", "propertyNames", "$defs"}


class CrdSchemaError(ConfigError):
    """The policy models hold a construct this converter cannot make structural."""


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**copy.deepcopy(target), **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolve(merged, defs)
    return {key: _resolve(value, defs) for key, value in node.items()}


def _is_int_or_string(branches: list[dict[str, Any]]) -> bool:
    types = sorted(str(b.get("type")) for b in branches)
    return types in (["integer", "string"], ["number", "string"])


def _merge_objects(branches: list[dict[str, Any]]) -> dict[str, Any]:
    """A union of objects tagged by `type` as one object: `type` an enum, the union of the fields."""
    properties: dict[str, Any] = {}
    tags: list[Any] = []
    for branch in branches:
        if branch.get("type") != "object":
            raise CrdSchemaError(f"cannot merge a union of non-objects: {branch}")
        for name, schema in branch.get("properties", {}).items():
            if name == "type":
                tags.extend(schema.get("enum", []))
                continue
            if name in properties and properties[name] != schema:
                if properties[name].get("type") != schema.get("type"):
                    raise CrdSchemaError(f"field {name!r} has different types in a union")
                properties[name] = {"type": schema["type"]}  # the controller checks the rest
            else:
                properties.setdefault(name, schema)
    properties["type"] = {"type": "string", "enum": sorted(tags)}
    return {"type": "object", "properties": dict(sorted(properties.items())), "required": ["type"]}


def structural(node: Any) -> Any:
    """The resolved pydantic schema `node` in the structural form a CRD needs."""
    if isinstance(node, list):
        return [structural(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key == "additionalProperties" and value is False:
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "exclusiveMinimum" and not isinstance(value, bool):
            out["minimum"] = value
            out["exclusiveMinimum"] = True
        elif key in ("properties",):
            out[key] = {name: structural(schema) for name, schema in value.items()}
        elif key in ("anyOf", "oneOf"):
            continue
        else:
            out[key] = structural(value)
    union = node.get("anyOf") or node.get("oneOf")
    if union is not None:
        branches = [structural(b) for b in union if b.get("type") != "null"]
        nullable = len(branches) < len(union)
        if len(branches) == 1:
            out = {**branches[0], **out}
        elif _is_int_or_string(branches):
            out["x-kubernetes-int-or-string"] = True
            string = next(b for b in branches if b.get("type") == "string")
            if "pattern" in string:
                out["pattern"] = string["pattern"]  # a pattern applies to strings only: an integer passes
        elif all(b.get("type") == "object" for b in branches):
            out = {**_merge_objects(branches), **{k: v for k, v in out.items() if k == "description"}}
        else:
            raise CrdSchemaError(f"cannot make this union structural: {union}")
        if nullable:
            out["nullable"] = True
    return out


def spec_schema() -> dict[str, Any]:
    """The openAPIV3Schema of `spec`: the policy document, apiVersion, kind and name optional."""
    document = policy_json_schema()
    resolved = _resolve({k: v for k, v in document.items() if k != "$defs"}, document.get("$defs", {}))
    spec: dict[str, Any] = structural(resolved)
    spec["required"] = [name for name in spec.get("required", []) if name not in ("apiVersion", "kind", "name")]
    spec["description"] = (
        "the policy document (rules/schema.json); apiVersion and kind may be left out, name defaults to metadata.name"
    )
    return spec


def _condition_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {"type": "string"},
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": {"type": "string"},
            "message": {"type": "string"},
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "observedGeneration": {"type": "integer"},
        },
    }


def status_schema() -> dict[str, Any]:
    """What the leader writes (controller/adapters/policies/crd.py `policy_status`)."""
    action = {
        "type": "object",
        "properties": {
            "type": {"type": "string"},
            "status": {"type": "string"},
            "error": {"type": "string"},
        },
    }
    target = {
        "type": "object",
        "properties": {
            "condition": {"type": "string"},
            "target": {"type": "object", "additionalProperties": {"type": "string"}},
            "phase": {"type": "string", "enum": ["ok", "pending", "firing", "stale", "errored"]},
            "lastValue": {"type": "number", "nullable": True},
            "lastValueTime": {"type": "string", "format": "date-time"},
            "streak": {"type": "integer"},
            "cooldownRemainingSeconds": {"type": "number"},
            "budgetUsed": {"type": "integer"},
            "lastDecision": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "kind": {"type": "string"},
                    "time": {"type": "string", "format": "date-time"},
                    "actions": {"type": "array", "items": action},
                },
            },
        },
    }
    return {
        "type": "object",
        "properties": {
            "observedGeneration": {"type": "integer"},
            "policy": {"type": "string", "description": "the policy's name in the controller"},
            "conditions": {"type": "array", "items": _condition_schema()},
            "targets": {"type": "array", "items": target},
            "targetsFiring": {"type": "integer"},
            "lastAction": {"type": "string", "description": "the newest action: type and outcome"},
            "invalid": {
                "type": "array",
                "description": "why the latest generation is not running (field: reason)",
                "items": {"type": "string"},
            },
        },
    }


def crd_manifest() -> dict[str, Any]:
    """The CustomResourceDefinition (deploy/crds/tailguardpolicy.yaml)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Firing", "type": "integer", "jsonPath": ".status.targetsFiring"},
                        {
                            "name": "Ready",
                            "type": "string",
                            "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
                        },
                        {"name": "Last Action", "type": "string", "jsonPath": ".status.lastAction"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "a tailguard policy (the controller watches these beside its policy files)",
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


def render_crd() -> str:
    """The CRD as YAML: stable (sorted keys), with a header saying where it comes from."""
    header = (
        "# Generated by `python scripts/generate_crd.py` from the policy models (controller/core/policy.py);\n"
        "# tests/unit/test_policy_crd.py fails when it is out of date. Install: kubectl apply -f deploy/crds/\n"
    )
    return header + yaml.safe_dump(crd_manifest(), sort_keys=True, width=120)


def policy_manifest(document: dict[str, Any], namespace: str) -> dict[str, Any]:
    """A policy file's document as a TailguardPolicy manifest (the inverse of crd.policy_document): the name goes
    to metadata.name, everything else (as written: durations stay strings) under spec."""
    spec = {key: value for key, value in document.items() if key not in ("apiVersion", "kind", "name")}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": str(document["name"]), "namespace": namespace},
        "spec": spec,
    }
