"""`tailguard rules to-cr`: every shipped policy file becomes a TailguardPolicy manifest the fake Kubernetes API
(which validates custom resources against deploy/crds) accepts, and that loads back as the same policy; an
invalid policy file is reported as file:line and printed as no manifest."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tailguard.controller.adapters.policies.crd import policy_document
from tailguard.controller.app.cli import EXIT_INVALID, EXIT_OK, main
from tailguard.controller.core.policy_files import load_policies, parse_policy_text
from tests.support.fake_kubernetes import FakeKubernetes

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "rules" / "examples"  # the policies deploy/base ships in its ConfigMap


def test_every_shipped_policy_converts_to_a_valid_custom_resource(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "to-cr", str(SHIPPED), "--namespace", "tailguard"]) == EXIT_OK
    manifests = [m for m in yaml.safe_load_all(capsys.readouterr().out) if m]
    loaded, errors = load_policies([SHIPPED])
    assert errors == []
    assert sorted(m["metadata"]["name"] for m in manifests) == sorted(entry.policy.name for entry in loaded)
    by_name = {entry.policy.name: entry.policy for entry in loaded}
    with FakeKubernetes() as kube:
        for manifest in manifests:
            assert manifest["kind"] == "TailguardPolicy" and manifest["metadata"]["namespace"] == "tailguard"
            stored = kube.put_object(manifest)  # refused (InvalidObject) if the CRD's schema does not accept it
            text = yaml.safe_dump(policy_document(stored), sort_keys=False)
            (back,), problems = parse_policy_text(text, "cr")
            assert problems == []
            assert back.policy == by_name[manifest["metadata"]["name"]], "the same policy, from the CR"


def test_an_invalid_policy_file_is_an_error_and_no_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.yaml").write_text("apiVersion: tailguard.io/v1alpha1\nkind: Policy\nname: x\nintervl: 1s\n")
    assert main(["rules", "to-cr", str(tmp_path), "-n", "tailguard"]) == EXIT_INVALID
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "bad.yaml:" in captured.err
