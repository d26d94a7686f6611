"""serving/tier/manifests/: the vLLM tier's kustomizations render offline, validate, and match the engine profiles."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_validate.utils import latest_version

from tailguard.serving.tier.manifests import (
    MANIFESTS_DIR,
    PROFILE_ANNOTATION,
    generated_files,
    load_profiles,
    main,
    outdated_files,
    render_kustomization,
    validate_objects,
    vllm_args,
)
from tailguard.serving.tier.profiles import builtin_profile_names, profile_from_dict

REPO = Path(__file__).resolve().parents[2]
SPECS = REPO / "tests" / "support" / "specs"
DCGM_FIELDS = {"DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_DEV_MEM_COPY_UTIL"}


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [document for document in objects if document["kind"] == kind]


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (match,) = [doc for doc in by_kind(objects, kind) if doc["metadata"]["name"] == name]
    return match


def flag_value(args: list[str], flag: str) -> str:
    assert args.count(flag) == 1, f"{flag} in {args}"
    return args[args.index(flag) + 1]


def container_args(objects: list[dict[str, Any]], deployment: str) -> list[str]:
    (container,) = named(objects, "Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


@pytest.fixture(scope="module")
def tier() -> list[dict[str, Any]]:
    return render_kustomization(MANIFESTS_DIR)


def test_generated_files_are_up_to_date() -> None:
    assert outdated_files(generated_files()) == []
    assert main(["--check"]) == 0


def test_check_names_a_stale_file() -> None:
    files = generated_files()
    path = MANIFESTS_DIR / "base" / "deployment-canary.yaml"
    changed = {**files, path: files[path] + "# edited\n"}
    assert outdated_files(changed) == [path]


@pytest.mark.parametrize(
    ("engine_args", "expected"),
    [
        ({"gpu_memory_utilization": 0.9}, ["--gpu-memory-utilization", "0.9"]),
        ({"enable_prefix_caching": True}, ["--enable-prefix-caching"]),
        ({"enable_prefix_caching": False}, ["--no-enable-prefix-caching"]),
        ({"tensor_parallel_size": 4}, ["--tensor-parallel-size", "4"]),
        ({"quantization": "awq"}, ["--quantization", "awq"]),
        ({"quantization": None}, []),
        ({"max_num_seqs": 2}, ["--max-num-seqs", "2"]),
        ({"kv_cache_dtype": "fp8"}, ["--kv-cache-dtype", "fp8"]),
        ({"enable_lora": True}, ["--enable-lora"]),
        ({"enable_lora": False}, []),
        ({"num_gpu_blocks_override": 48}, ["--num-gpu-blocks-override", "48"]),
    ],
)
def test_engine_args_become_official_vllm_flags(engine_args: dict[str, Any], expected: list[str]) -> None:
    profile = profile_from_dict({"name": "p", "model": "m", "engineArgs": engine_args})
    assert vllm_args(profile) == ["--model", "/models/m", "--served-model-name", "m", "--port", "8000", *expected]


def test_every_object_of_the_tier_is_valid(tier: list[dict[str, Any]]) -> None:
    assert validate_objects(tier, SPECS, latest_version()) == []
    kinds = {document["kind"] for document in tier}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "HTTPRoute", "PodMonitor", "DaemonSet"} <= kinds
    assert {"ServiceMonitor", "ConfigMap", "ClusterRole", "PersistentVolumeClaim"} <= kinds


@pytest.mark.parametrize("profile_name", builtin_profile_names())
def test_each_profile_overlay_ships_that_profile_on_the_canary(profile_name: str) -> None:
    objects = render_kustomization(MANIFESTS_DIR / "overlays" / profile_name)
    assert validate_objects(objects, SPECS, latest_version()) == []
    profile = load_profiles()[profile_name]
    canary = named(objects, "Deployment", "chat-canary")
    assert canary["spec"]["template"]["metadata"]["annotations"][PROFILE_ANNOTATION] == profile_name
    assert container_args(objects, "chat-canary") == vllm_args(profile)
    # The stable version keeps the stable profile whatever the canary runs.
    assert container_args(objects, "chat-stable") == vllm_args(load_profiles()["stable"])


def test_bad_profile_renders_max_num_seqs_2_on_the_canary_only() -> None:
    objects = render_kustomization(MANIFESTS_DIR / "overlays" / "bad-max-num-seqs")
    assert flag_value(container_args(objects, "chat-canary"), "--max-num-seqs") == "2"
    assert flag_value(container_args(objects, "chat-stable"), "--max-num-seqs") == "64"


def test_the_change_tracker_reads_the_profile_back_from_the_args() -> None:
    from tailguard.controller.adapters.changes.tracker import parse_vllm_args

    parsed = parse_vllm_args(vllm_args(load_profiles()["bad-max-num-seqs"]))
    assert parsed["max_num_seqs"] == "2" and parsed["enable_prefix_caching"] is True
    assert parsed["gpu_memory_utilization"] == "0.9"


def test_stable_deployment_args_and_gpus_match_the_profile(tier: list[dict[str, Any]]) -> None:
    stable = load_profiles()["stable"]
    args = container_args(tier, "chat-stable")
    assert flag_value(args, "--gpu-memory-utilization") == "0.9"
    assert "--enable-prefix-caching" in args
    assert flag_value(args, "--tensor-parallel-size") == str(stable.engineArgs.tensor_parallel_size)
    (container,) = named(tier, "Deployment", "chat-stable")["spec"]["template"]["spec"]["containers"]
    gpus = str(stable.engineArgs.tensor_parallel_size)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == gpus
    assert container["resources"]["requests"]["nvidia.com/gpu"] == gpus
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_versions_carry_the_labels_the_policies_select_on(tier: list[dict[str, Any]]) -> None:
    for version in ("stable", "canary"):
        deployment = named(tier, "Deployment", f"chat-{version}")
        assert deployment["metadata"]["namespace"] == "llm"
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels["service"] == "chat" and labels["version"] == version
        service = named(tier, "Service", f"chat-{version}")
        assert all(labels.get(key) == value for key, value in service["spec"]["selector"].items())
    # The PodMonitor selects the vLLM pods and copies service/version onto the series.
    (monitor,) = by_kind(tier, "PodMonitor")
    pod_labels = named(tier, "Deployment", "chat-stable")["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    targets = {relabel["targetLabel"]: relabel["sourceLabels"] for relabel in endpoint["relabelings"]}
    assert targets == {
        "service": ["__meta_kubernetes_pod_label_service"],
        "version": ["__meta_kubernetes_pod_label_version"],
    }


def test_hpa_scales_the_stable_deployment_on_waiting_requests_and_request_rate(tier: list[dict[str, Any]]) -> None:
    (hpa,) = by_kind(tier, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat-stable"}
    # Both of the seed's targets: queue length 20 and request rate 50 per pod.
    targets = {
        metric["pods"]["metric"]["name"]: metric["pods"]["target"]
        for metric in hpa["spec"]["metrics"]
        if metric["type"] == "Pods"
    }
    assert targets == {
        "vllm_num_requests_waiting": {"type": "AverageValue", "averageValue": "20"},
        "vllm_requests_per_second": {"type": "AverageValue", "averageValue": "50"},
    }
    # The adapter rules documented next to the manifests produce exactly those names from vLLM's series.
    adapter = yaml.safe_load((MANIFESTS_DIR / "prometheus-adapter-rules.yaml").read_text())
    served = {}
    for rule in adapter["rules"]:
        series = rule["seriesQuery"].split("{")[0]
        served[re.sub(rule["name"]["matches"], rule["name"]["as"].replace("${1}", r"\1"), series)] = rule
    assert set(served) == set(targets)
    assert served["vllm_num_requests_waiting"]["seriesQuery"].startswith("vllm:num_requests_waiting{")
    rate = served["vllm_requests_per_second"]
    assert rate["seriesQuery"].startswith("vllm:request_success_total{") and "rate(" in rate["metricsQuery"]
    # The metric the rule reads is one real vLLM exports (its /metrics page).
    page = (REPO / "tests" / "fixtures" / "vllm-0.32-cpu-metrics.txt").read_text()
    assert "# TYPE vllm:request_success_total counter" in page


def test_httproute_splits_between_the_version_services(tier: list[dict[str, Any]]) -> None:
    (route,) = by_kind(tier, "HTTPRoute")
    (rule,) = route["spec"]["rules"]
    weights = {ref["name"]: ref["weight"] for ref in rule["backendRefs"]}
    assert weights == {"chat-stable": 90, "chat-canary": 10}
    services = {service["metadata"]["name"]: service for service in by_kind(tier, "Service")}
    for ref in rule["backendRefs"]:
        assert ref["port"] in {port["port"] for port in services[ref["name"]]["spec"]["ports"]}


def test_dcgm_exporter_exports_the_hbm_fields_with_service_and_version(tier: list[dict[str, Any]]) -> None:
    (daemonset,) = by_kind(tier, "DaemonSet")
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert "--kubernetes-enable-pod-labels" in container["args"]
    counters = next(cm for cm in by_kind(tier, "ConfigMap") if cm["metadata"]["name"].startswith("dcgm-exporter-"))
    csv = counters["data"]["counters.csv"]
    fields = {line.split(",")[0].strip() for line in csv.splitlines() if line and not line.startswith("#")}
    assert fields >= DCGM_FIELDS
    monitor = named(tier, "ServiceMonitor", "dcgm-exporter")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    relabels = {r.get("targetLabel"): r.get("sourceLabels") for r in endpoint["metricRelabelings"]}
    assert relabels["service"] == ["pod_label_service"] and relabels["version"] == ["pod_label_version"]
    keep = next(r for r in endpoint["metricRelabelings"] if r["action"] == "keep")
    assert all(re.fullmatch(keep["regex"], field) for field in DCGM_FIELDS)
    # The exporter reads pod labels and nothing else.
    (role,) = by_kind(tier, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
