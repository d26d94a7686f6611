"""rules/schema.json: up to date, and it agrees with the pydantic models on the shipped policies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tailguard.controller.core.policy import Policy, policy_json_schema

ROOT = Path(__file__).resolve().parent.parent.parent
SCHEMA_FILE = ROOT / "rules" / "schema.json"
FIXTURES = ROOT / "tests" / "fixtures" / "policies"
EXAMPLE_FILES = sorted((ROOT / "rules" / "examples").glob("*.yaml"))
VALID_FIXTURES = sorted((FIXTURES / "valid").glob("*.yaml"))


def _validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]


def test_schema_file_is_up_to_date() -> None:
    expected = json.dumps(policy_json_schema(), indent=2, sort_keys=True) + "\n"
    actual = SCHEMA_FILE.read_text(encoding="utf-8") if SCHEMA_FILE.exists() else ""
    assert actual == expected, "rules/schema.json is out of date: run make schema"


def test_there_are_examples() -> None:
    assert len(EXAMPLE_FILES) >= 3


@pytest.mark.parametrize("path", EXAMPLE_FILES + VALID_FIXTURES, ids=lambda p: p.name)
def test_policy_validates_with_json_schema_and_pydantic(path: Path) -> None:
    validator = _validator()
    documents = _documents(path)
    assert documents
    for document in documents:
        errors = [error.message for error in validator.iter_errors(document)]
        assert errors == []
        Policy.model_validate(document)


# Invalid fixtures whose mistake is structural, so an editor catches it too (cross-references,
# duplicate keys and YAML syntax are only caught by `tailguard rules validate`).
SCHEMA_REJECTS = {
    "unknown-field.yaml": "Additional properties are not allowed ('treshold' was unexpected)",
    "missing-nodata.yaml": "'noData' is a required property",
    "bad-duration.yaml": "'5 minutes' is not valid under any of the given schemas",
    "bad-op.yaml": "'=>' is not one of ['>', '>=', '<', '<=']",
    "for-zero.yaml": "0 is not valid under any of the given schemas",
    "wrong-api-version.yaml": "'tailguard.io/v1alpha1' was expected",
    "label-with-dash.yaml": "'model-name' does not match '^[A-Za-z_][A-Za-z0-9_]*$'",
}


@pytest.mark.parametrize("name", sorted(SCHEMA_REJECTS))
def test_schema_rejects_structural_mistakes(name: str) -> None:
    (document,) = _documents(FIXTURES / "invalid" / name)
    messages = [error.message for error in _validator().iter_errors(document)]
    assert SCHEMA_REJECTS[name] in " | ".join(messages)


def test_schema_rejects_a_dash_in_a_match_label() -> None:
    (document,) = _documents(EXAMPLE_FILES[0])
    document["targets"]["match"] = {"name-space": "llm"}
    messages = [error.message for error in _validator().iter_errors(document)]
    assert messages == ["'name-space' does not match '^[A-Za-z_][A-Za-z0-9_]*$'"]


def test_schema_defaults_are_valid_values() -> None:
    schema = policy_json_schema()
    condition = schema["$defs"]["Condition"]["properties"]
    assert condition["staleAfter"]["default"] == "300s"
    assert schema["$defs"]["Recovery"]["properties"]["for"]["default"] == 1
    assert schema["$defs"]["Limits"]["properties"]["cooldown"]["default"] == "300s"
    assert schema["properties"]["interval"]["default"] == "15s"
