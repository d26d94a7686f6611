"""Policy loading: every invalid fixture fails with exactly one clear, located error."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailguard.controller.core.policy import NoDataPolicy
from tailguard.controller.core.policy_files import PolicyError, load_policies, parse_policy_text

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "policies"
EXAMPLES = Path(__file__).resolve().parent.parent.parent / "rules" / "examples"

ACTION_TYPES = "'rollback', 'scale', 'shift_traffic', 'restore', 'annotate', 'notify'"
ACTION_VARS = "condition, decision_id, onset, policy, service, target, threshold, value"

# file name -> (line, field, message)
INVALID = {
    "unknown-field.yaml": (15, "conditions[0].treshold", "unknown field (not part of the policy schema)"),
    "missing-nodata.yaml": (10, "conditions[0].noData", "required field is missing"),
    "bad-duration.yaml": (
        15,
        "conditions[0].staleAfter",
        "expected a duration such as '15s', '5m' or '1h30m', got '5 minutes'",
    ),
    "bad-op.yaml": (12, "conditions[0].when.op", "Input should be '>', '>=', '<' or '<=', got '=>'"),
    "for-zero.yaml": (13, "conditions[0].for", "a count of evaluations must be at least 1"),
    "undefined-signal.yaml": (11, "conditions[0].signal", "undefined signal 'uptime'; expected one of up"),
    "undefined-query-variable.yaml": (
        9,
        "signals[0].query",
        "undefined template variable(s) job; expected one of by, namespace, selector",
    ),
    "undefined-action-variable.yaml": (
        18,
        "conditions[0].actions[1].text",
        f"undefined template variable(s) region; expected one of {ACTION_VARS}",
    ),
    "duplicate-key.yaml": (15, "conditions[0].noData", "duplicate key"),
    "wrong-api-version.yaml": (1, "apiVersion", "expected 'tailguard.io/v1alpha1', got 'tailguard.io/v1'"),
    "invalid-yaml.yaml": (6, "", "invalid YAML: expected ',' or ']', but got ':'"),
    "unknown-action-type.yaml": (
        16,
        "conditions[0].actions[0]",
        "unknown action type 'reboot'; expected one of " + ACTION_TYPES,
    ),
    "scale-two-modes.yaml": (
        16,
        "conditions[0].actions[0]",
        "scale needs exactly one of replicas, delta or targetPerReplica",
    ),
    "not-a-mapping.yaml": (2, "", "expected a mapping (a policy document)"),
    "label-with-dash.yaml": (
        5,
        "targets.groupBy[1]",
        "expected a Prometheus label name ([A-Za-z_][A-Za-z0-9_]*), got 'model-name'",
    ),
}


def test_every_invalid_fixture_has_an_expected_error() -> None:
    assert sorted(p.name for p in (FIXTURES / "invalid").glob("*.yaml")) == sorted(INVALID)


@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_policy_reports_file_line_field_and_message(name: str) -> None:
    path = FIXTURES / "invalid" / name
    policies, errors = load_policies([path])
    line, field, message = INVALID[name]
    assert policies == []
    assert errors == [PolicyError(str(path), line, field, message)]


def test_error_renders_as_file_line_field_message() -> None:
    assert str(PolicyError("p.yaml", 3, "conditions[0].for", "bad")) == "p.yaml:3: conditions[0].for: bad"
    assert str(PolicyError("p.yaml", 6, "", "invalid YAML: x")) == "p.yaml:6: invalid YAML: x"


def test_duplicate_policy_names_across_files() -> None:
    directory = FIXTURES / "duplicate-names"
    policies, errors = load_policies([directory])
    assert [loaded.policy.name for loaded in policies] == ["same-name", "same-name"]
    assert errors == [
        PolicyError(
            str(directory / "b.yaml"),
            1,
            "name",
            f"policy name 'same-name' is already used at {directory / 'a.yaml'}:1",
        )
    ]


def test_valid_fixtures_load_with_their_values() -> None:
    policies, errors = load_policies([FIXTURES / "valid"])
    assert errors == []
    by_name = {loaded.policy.name: loaded for loaded in policies}
    assert sorted(by_name) == ["first", "minimal", "second"]
    assert by_name["second"].line == 21  # the second document of two-documents.yaml
    second = by_name["second"].policy
    assert second.dryRun is True
    condition = second.conditions[0]
    assert condition.noData is NoDataPolicy.OK
    assert condition.for_.seconds == 90.0 and condition.for_.count is None
    assert condition.staleAfter == 300.0 and condition.maxSourceErrors == 2
    assert condition.recovery.for_.seconds == 45.0
    assert second.limits.cooldown == 0.0 and second.limits.maxActionsPerHour == 0
    minimal = by_name["minimal"].policy
    assert minimal.interval == 15.0
    assert minimal.conditions[0].for_.count == 2
    assert minimal.conditions[0].staleAfter == 300.0 and minimal.conditions[0].maxSourceErrors == 4
    assert minimal.conditions[0].recovery.for_.count == 1
    assert minimal.limits.cooldown == 300.0 and minimal.limits.maxActionsPerHour == 6


def test_shipped_examples_load() -> None:
    policies, errors = load_policies([EXAMPLES])
    assert errors == []
    names = sorted(loaded.policy.name for loaded in policies)
    assert {"error-rate-shift", "p99-rollback", "queue-scale"} <= set(names)
    assert len(names) == len(list(EXAMPLES.glob("*.yaml")))


BASE = """\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: p
targets:
  groupBy: [service]
signals:
  - name: s
    query: up
conditions:
  - name: c
    signal: s
    when: {op: ">", value: 1}
    for: 1
    noData: hold
    actions:
"""


@pytest.mark.parametrize(
    ("actions", "line", "field", "message"),
    [
        (
            '      - type: annotate\n        text: ok\n        tags: [fine, "{{ zone }}"]\n',
            18,
            "conditions[0].actions[0].tags[1]",
            f"undefined template variable(s) zone; expected one of {ACTION_VARS}",
        ),
        (
            "      - type: scale\n        delta: 1\n        min: 5\n        max: 2\n",
            16,
            "conditions[0].actions[0]",
            "scale min (5) is above max (2)",
        ),
        (
            "      - service: x\n",
            16,
            "conditions[0].actions[0]",
            "an action needs a 'type' (rollback, scale, shift_traffic, restore, annotate or notify)",
        ),
        (
            "      - type: shift_traffic\n        weight: 150\n",
            17,
            "conditions[0].actions[0].weight",
            "Input should be less than or equal to 100, got 150",
        ),
    ],
)
def test_action_errors(actions: str, line: int, field: str, message: str) -> None:
    policies, errors = parse_policy_text(BASE + actions, "inline.yaml")
    assert policies == []
    assert errors == [PolicyError("inline.yaml", line, field, message)]


def test_recovery_action_variable_is_checked() -> None:
    text = BASE + (
        "      - type: rollback\n"
        "    recovery:\n"
        "      actions:\n"
        "        - type: notify\n"
        "          receiver: team\n"
        '          message: "{{ nope }}"\n'
    )
    _, errors = parse_policy_text(text, "r.yaml")
    assert errors == [
        PolicyError(
            "r.yaml",
            21,
            "conditions[0].recovery.actions[0].message",
            f"undefined template variable(s) nope; expected one of {ACTION_VARS}",
        )
    ]


def test_default_template_needing_an_absent_label_is_rejected() -> None:
    # rollback's service defaults to "{{ service }}": a policy grouped by model has no such variable.
    text = BASE.replace("groupBy: [service]", "groupBy: [model]") + "      - type: rollback\n"
    _, errors = parse_policy_text(text, "d.yaml")
    assert [(e.line, e.field) for e in errors] == [(16, "conditions[0].actions[0].service")]
    assert errors[0].message.startswith("undefined template variable(s) service;")


def test_repeated_condition_name_points_at_the_repeat() -> None:
    text = BASE + "      - type: rollback\n" + BASE.split("conditions:\n", 1)[1] + "      - type: rollback\n"
    _, errors = parse_policy_text(text, "n.yaml")
    message = "condition names must be unique; 'c' is repeated"
    assert errors == [PolicyError("n.yaml", 17, "conditions[1].name", message)]


def test_empty_documents_are_skipped_and_unreadable_files_reported(tmp_path: Path) -> None:
    assert parse_policy_text("# only a comment\n---\n", "e.yaml") == ([], [])
    missing = tmp_path / "missing.yaml"
    _, errors = load_policies([missing])
    assert len(errors) == 1
    assert (errors[0].file, errors[0].line, errors[0].field) == (str(missing), 1, "")
    assert errors[0].message.startswith("cannot read policy file:")


@pytest.mark.parametrize(
    ("section", "line", "field"),
    [("vars:\n  by: service\n", 18, "vars.by"), ("vars:\n  value: x\n", 18, "vars.value")],
)
def test_reserved_variable_names_are_rejected(section: str, line: int, field: str) -> None:
    _, errors = parse_policy_text(BASE + "      - type: rollback\n" + section, "v.yaml")
    name = field.split(".")[-1]
    assert errors == [
        PolicyError(
            "v.yaml",
            line,
            field,
            f"{name!r} is a reserved template variable "
            "(by, condition, decision_id, onset, policy, selector, target, threshold, value)",
        )
    ]


def test_reserved_match_label_is_rejected() -> None:
    text = BASE.replace("groupBy: [service]", "groupBy: [service]\n  match: {selector: x}")
    text += "      - type: rollback\n"
    _, errors = parse_policy_text(text, "m.yaml")
    assert [(e.line, e.field) for e in errors] == [(6, "targets.match.selector")]


def test_hidden_paths_under_a_policy_directory_are_not_loaded_twice(tmp_path: Path) -> None:
    """A mounted ConfigMap: `p.yaml` links into the kubelet's hidden `..<timestamp>/` copy."""
    stamped = tmp_path / "..2026_11_30_12_00_00.000000001"
    stamped.mkdir()
    (stamped / "p99-rollback.yaml").write_text(
        (Path(__file__).parents[2] / "rules/examples/p99-rollback.yaml").read_text()
    )
    (tmp_path / "p99-rollback.yaml").symlink_to(stamped.name + "/p99-rollback.yaml")
    policies, errors = load_policies([tmp_path])
    assert errors == []
    assert [loaded.policy.name for loaded in policies] == ["p99-rollback"]
