"""deploy/ renders, validates offline against the Kubernetes schemas, and keeps its promises:
Triton only on localhost, SYS_ADMIN only for the active sidecar, probes, requests, the token
from a Secret, the table from the ConfigMap, the scrape wired to the sidecar's port."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from yamllint import linter
from yamllint.config import YamlLintConfig

from api.config import ENV_PREFIX, GatewayConfig, add_arguments, from_args
from tests.deploy.kustomize import Resource, build
from time2clock.table import Time2ClockTable

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = ("shadow", "active")
K8S_VERSION = "1.30.0"  # schemas bundled in kubernetes-validate: no network
YAMLLINT = YamlLintConfig(
    "extends: default\n"
    "rules: {document-start: disable, line-length: {max: 100},"
    " comments: {min-spaces-from-content: 2}, truthy: {check-keys: false}}\n"
)
# kubernetes-validate has no CRDs; the ServiceMonitor fields we use, as the Prometheus
# Operator's CRD (monitoring.coreos.com/v1) defines them.
SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "properties": {
                        "matchLabels": {
                            "type": "object",
                            "additionalProperties": {"type": "string"},
                        }
                    },
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                        },
                        "required": ["port"],
                    },
                },
            },
        },
    },
}


def rendered(overlay: str) -> list[Resource]:
    return build(DEPLOY / "overlays" / overlay)


def one(resources: list[Resource], kind: str) -> Resource:
    (found,) = [r for r in resources if r["kind"] == kind]
    return found


def containers(resources: list[Resource]) -> dict[str, Resource]:
    pod = one(resources, "Deployment")["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["containers"]}


def env(container: Resource) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def validate(resource: Resource) -> None:
    if resource["kind"] == "ServiceMonitor":
        jsonschema.validate(resource, SERVICE_MONITOR_SCHEMA)
    else:
        kubernetes_validate.validate(resource, K8S_VERSION, strict=True)


def test_yaml_is_clean() -> None:
    files = sorted(DEPLOY.rglob("*.yaml"))
    assert len(files) >= 7
    for path in files:
        problems = list(linter.run(path.read_text(), YAMLLINT, str(path)))
        assert not problems, f"{path}: {[str(p) for p in problems]}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_validates_against_the_kubernetes_schemas(overlay: str) -> None:
    resources = rendered(overlay)
    assert sorted(r["kind"] for r in resources) == [
        "ConfigMap",
        "Deployment",
        "Service",
        "ServiceMonitor",
    ]
    for resource in resources:
        validate(resource)


def test_the_validators_can_fail() -> None:
    resources = rendered("shadow")
    broken = copy.deepcopy(one(resources, "Deployment"))
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(broken)
    typo = copy.deepcopy(one(resources, "Deployment"))
    typo["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(typo)
    monitor = copy.deepcopy(one(resources, "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["intervall"] = "5s"
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_least_privilege(overlay: str) -> None:
    pods = containers(rendered(overlay))
    sidecar, triton = pods["sidecar"], pods["triton"]
    for c in pods.values():
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert "privileged" not in c["securityContext"]
    assert "add" not in triton["securityContext"]["capabilities"]
    added = sidecar["securityContext"]["capabilities"].get("add", [])
    if overlay == "shadow":
        assert added == [] and sidecar["securityContext"]["runAsNonRoot"] is True
        assert env(sidecar)["SIDECAR_SHADOW"] == "1"
    else:
        assert added == ["SYS_ADMIN"] and sidecar["securityContext"]["runAsUser"] == 0
        assert env(sidecar)["SIDECAR_SHADOW"] == "0"
    # the base alone is the safe default: shadow, nothing added
    base = containers(build(DEPLOY / "base"))["sidecar"]
    assert (
        env(base)["SIDECAR_SHADOW"] == "1" and "add" not in base["securityContext"]["capabilities"]
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_sidecar_owns_the_service_port_and_triton_stays_on_localhost(overlay: str) -> None:
    resources = rendered(overlay)
    pods = containers(resources)
    sidecar, triton = pods["sidecar"], pods["triton"]
    args = dict(a.removeprefix("--").split("=", 1) for a in triton["args"])
    assert args["http-address"] == "127.0.0.1" and args["grpc-address"] == "127.0.0.1"
    assert env(sidecar)["SIDECAR_TRITON_URL"] == f"127.0.0.1:{args['http-port']}"
    triton_ports = {p["containerPort"] for p in triton.get("ports", [])}
    assert int(args["http-port"]) not in triton_ports and int(args["grpc-port"]) not in triton_ports
    sidecar_ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    assert int(env(sidecar)["SIDECAR_PORT"]) == sidecar_ports["http"]
    assert env(sidecar)["SIDECAR_HOST"] == "0.0.0.0"
    service = one(resources, "Service")
    http = next(p for p in service["spec"]["ports"] if p["name"] == "http")
    assert http["targetPort"] == "http" and http["port"] == sidecar_ports["http"]
    pod_labels = one(resources, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_requests_secret_and_table(overlay: str) -> None:
    resources = rendered(overlay)
    pods = containers(resources)
    for c in pods.values():
        assert {"cpu", "memory"} <= set(c["resources"]["requests"])
        assert "livenessProbe" in c and "startupProbe" in c
    sidecar = pods["sidecar"]
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert pods["triton"]["resources"]["limits"]["nvidia.com/gpu"] == 1
    token = env(sidecar)["SIDECAR_ADMIN_TOKEN"]
    assert token["secretKeyRef"]["name"] == "sidecar-admin" and token["secretKeyRef"]["key"]
    # the table: the ConfigMap's key, mounted where SIDECAR_TABLE looks, is a valid table
    table_path = Path(env(sidecar)["SIDECAR_TABLE"])
    mount = next(m for m in sidecar["volumeMounts"] if m["name"] == "tables")
    assert table_path.parent == Path(mount["mountPath"])
    pod = one(resources, "Deployment")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "tables")
    config_map = one(resources, "ConfigMap")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    table = Time2ClockTable.from_json(json.loads(config_map["data"][table_path.name]))
    assert table.clocks_mhz


def sidecar_config(sidecar: Resource, monkeypatch: pytest.MonkeyPatch) -> GatewayConfig:
    """The configuration the sidecar container's ``SIDECAR_*`` variables give (a Secret's value
    stands in as a token); every variable must be one the sidecar knows."""
    variables = env(sidecar)
    for name, value in variables.items():
        if name.startswith(ENV_PREFIX):
            monkeypatch.setenv(name, value if isinstance(value, str) else "token-from-secret")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    known = {a.dest for a in parser._actions}
    ours = {n.removeprefix(ENV_PREFIX).lower() for n in variables if n.startswith(ENV_PREFIX)}
    assert ours <= known, f"unknown SIDECAR_ variables: {ours - known}"
    return from_args(parser.parse_args([]))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_sidecar_environment_is_a_valid_configuration(
    overlay: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = sidecar_config(containers(rendered(overlay))["sidecar"], monkeypatch)
    assert config.shadow is (overlay == "shadow")
    assert config.triton_url == "127.0.0.1:8010" and config.device == "nvml:0"
    assert config.admin_token == "token-from-secret"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prometheus_scrapes_the_sidecar(overlay: str) -> None:
    resources = rendered(overlay)
    template = one(resources, "Deployment")["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    sidecar = containers(resources)["sidecar"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert int(annotations["prometheus.io/port"]) == sidecar["ports"][0]["containerPort"]
    monitor, service = one(resources, "ServiceMonitor"), one(resources, "Service")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    names = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == names
