"""A policy whose action type no configured actuator can run is refused: at start (`tailguard run` exits 2 with one
sentence naming the policy file, the action type and the section that would provide it) and on hot reload (a
reload error that keeps the last good set)."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import pytest

from tailguard.controller.app import cli
from tailguard.controller.app.build import build, missing_actuators
from tailguard.controller.app.settings import ControllerSettings, parse_settings_text
from tailguard.controller.core.policy_files import load_policies

BASE = """\
prometheus: {url: "http://127.0.0.1:9"}
policies: [rules]
listen: 127.0.0.1:0
reloadInterval: 1h
"""
ARGOCD = "argocd: {url: 'http://127.0.0.1:9', tokenEnv: TG_TEST_ARGOCD_TOKEN, apps: {chat: llm-chat}}\n"
TIER = "tier: {url: 'http://127.0.0.1:9'}\n"
KUBE_HPA = "kubernetes: {inCluster: false, kubeconfig: kubeconfig.yaml, hpa: {maxReplicas: 4}}\n"
KUBE_ROLLBACK = "kubernetes: {inCluster: false, kubeconfig: kubeconfig.yaml, rollback: {helm: true}}\n"
KUBE_TRAFFIC = (
    "kubernetes: {inCluster: false, kubeconfig: kubeconfig.yaml, traffic: {routes: {chat: {name: chat}}}}\n"
)

ACTIONS = {
    "rollback": '{type: rollback, service: "{{ service }}"}',
    "scale": '{type: scale, service: "{{ service }}", delta: 1, max: 4}',
    "shift_traffic": '{type: shift_traffic, service: "{{ service }}", version: canary, weight: 10}',
    "annotate": '{type: annotate, text: "p99 {{ value }}"}',
}


def policy(name: str, action: str, *, dry_run: bool = False, in_recovery: bool = False) -> str:
    fire, recover = ("annotate", action) if in_recovery else (action, "annotate")
    return f"""\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: {name}
interval: 1h
dryRun: {str(dry_run).lower()}
targets: {{groupBy: [service]}}
signals:
  - name: p99
    query: max by ({{{{ by }}}}) (lat)
conditions:
  - name: p99-high
    signal: p99
    when: {{op: ">", value: 0.8}}
    for: 1
    noData: hold
    actions:
      - {ACTIONS[fire]}
    recovery:
      when: {{op: "<=", value: 0.8}}
      for: 1
      actions:
        - {ACTIONS[recover]}
"""


def settings_for(tmp_path: Path, sections: str = "") -> ControllerSettings:
    return parse_settings_text(BASE + sections, str(tmp_path / "controller.yaml"), tmp_path)


def problems(tmp_path: Path, sections: str, text: str) -> list[str]:
    rules = tmp_path / "rules"
    rules.mkdir(exist_ok=True)
    (rules / "p.yaml").write_text(text, encoding="utf-8")
    loaded, errors = load_policies([rules])
    assert errors == []
    return [str(error) for error in missing_actuators(settings_for(tmp_path, sections), loaded)]


@pytest.mark.parametrize(
    ("action", "sections", "section_named"),
    [
        ("rollback", "", "add an `argocd` or `kubernetes.rollback` section (or `tier`)"),
        ("rollback", KUBE_HPA, "add an `argocd` or `kubernetes.rollback` section (or `tier`)"),
        ("scale", "", "add a `kubernetes.hpa` section (or `tier`)"),
        ("scale", KUBE_TRAFFIC + ARGOCD, "add a `kubernetes.hpa` section (or `tier`)"),
        ("shift_traffic", "", "add a `kubernetes.traffic` section (or `tier`)"),
        ("shift_traffic", KUBE_HPA, "add a `kubernetes.traffic` section (or `tier`)"),
    ],
)
def test_an_action_without_its_actuator_is_one_error_naming_file_type_and_section(
    tmp_path: Path, action: str, sections: str, section_named: str
) -> None:
    (found,) = problems(tmp_path, sections, policy("p", action))
    assert found == (
        f"{tmp_path / 'rules' / 'p.yaml'}:1: policy p has a {action} action, but no actuator for {action} is "
        f"configured: {section_named} to the controller configuration"
    )


@pytest.mark.parametrize(
    ("action", "sections"),
    [
        ("rollback", ARGOCD),
        ("rollback", TIER),
        ("rollback", KUBE_ROLLBACK),
        ("scale", KUBE_HPA),
        ("scale", TIER),
        ("shift_traffic", KUBE_TRAFFIC),
        ("shift_traffic", TIER),
        ("annotate", ""),
    ],
)
def test_an_action_with_its_actuator_passes(tmp_path: Path, action: str, sections: str) -> None:
    assert problems(tmp_path, sections, policy("p", action)) == []


def test_recovery_actions_count_and_dry_run_policies_need_no_actuator(tmp_path: Path) -> None:
    (found,) = problems(tmp_path, "", policy("p", "shift_traffic", in_recovery=True))
    assert "has a shift_traffic action" in found
    assert problems(tmp_path, "", policy("p", "rollback", dry_run=True)) == []
    # The controller-wide override wins over the policy's own flag, both ways.
    assert problems(tmp_path, "dryRun: true\n", policy("p", "rollback")) == []
    assert len(problems(tmp_path, "dryRun: false\n", policy("p", "rollback", dry_run=True))) == 1


def test_tailguard_run_refuses_to_start_with_exit_2_and_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TG_TEST_WEBHOOK_TOKEN", "not-a-real-token")
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "p99-rollback.yaml").write_text(policy("p99-rollback", "rollback"), encoding="utf-8")
    config = tmp_path / "controller.yaml"
    config.write_text(BASE + "webhook: {bearerTokenEnv: TG_TEST_WEBHOOK_TOKEN}\njournal: journal.db\n")
    assert cli.main(["run", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"{tmp_path / 'rules' / 'p99-rollback.yaml'}:1: policy p99-rollback has a rollback action, but no actuator "
        "for rollback is configured: add an `argocd` or `kubernetes.rollback` section (or `tier`) to the controller "
        "configuration\n"
    )
    assert not (tmp_path / "journal.db").exists(), "refused before anything was opened"


def test_a_hot_reload_that_brings_in_an_action_without_actuator_keeps_the_last_good_set(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "notes.yaml").write_text(policy("notes", "annotate"), encoding="utf-8")
    settings = settings_for(tmp_path, "journal: journal.db\nstateDir: state\n")
    with ExitStack() as stack:
        application = build(settings, stack, webhook_token=None)
        controller = application.controller
        controller.start()
        assert sorted(controller.policies()) == ["notes"]

        (rules / "scale.yaml").write_text(policy("scale", "scale"), encoding="utf-8")
        outcome = controller.reload()
        assert outcome.changed and not outcome.applied
        assert sorted(controller.policies()) == ["notes"], "the last good set keeps running"
        (error,) = (str(e) for e in controller.reload_errors())
        assert "scale.yaml:1: policy scale has a scale action" in error and "kubernetes.hpa" in error
        assert controller.readiness().reload_errors == (error,)

        (rules / "scale.yaml").write_text(policy("scale", "scale", dry_run=True), encoding="utf-8")
        outcome = controller.reload()
        assert outcome.applied and outcome.added == ("scale",)
        assert controller.reload_errors() == []


def test_the_shipped_configuration_has_an_actuator_for_every_shipped_policy() -> None:
    deploy = Path(__file__).resolve().parents[2] / "deploy"
    for config in (deploy / "base" / "controller.yaml", deploy / "overlays" / "example" / "controller.yaml"):
        settings = parse_settings_text(config.read_text(encoding="utf-8"), str(config), Path("/"))
        shipped = [path for path in (deploy / "base" / "policies").glob("*.yaml") if path.name != "kustomization.yaml"]
        loaded, errors = load_policies(shipped)
        assert errors == [] and len(loaded) == len(shipped) >= 6  # every example policy (hbm-headroom the 6th)
        # Not in dry run: the base must act (the overlay's dryRun: true would hide a missing actuator).
        acting = settings.model_copy(update={"dryRun": None})
        assert missing_actuators(acting, loaded) == [], config
