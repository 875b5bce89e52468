"""deploy/overlays/multi-gpu: one sidecar, four GPUs, one Triton per GPU, all on localhost."""

from __future__ import annotations

import pytest

from dvfs.factory import parse_device_list
from tests.deploy.kustomize import build
from tests.deploy.test_manifests import DEPLOY, containers, env, one, sidecar_config, validate

OVERLAY = DEPLOY / "overlays" / "multi-gpu"


def test_it_validates_against_the_kubernetes_schemas() -> None:
    resources = build(OVERLAY)
    assert sorted(r["kind"] for r in resources) == [
        "ConfigMap",
        "Deployment",
        "Service",
        "ServiceMonitor",
    ]
    for resource in resources:
        validate(resource)


def test_one_triton_per_gpu_in_the_order_the_sidecar_names_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pods = containers(build(OVERLAY))
    sidecar = pods.pop("sidecar")
    tritons = [pods["triton"], pods["triton-1"], pods["triton-2"], pods["triton-3"]]
    assert len(pods) == 4
    config = sidecar_config(sidecar, monkeypatch)
    assert config.device is not None and len(parse_device_list(config.device)) == 4
    assert config.shadow is True and config.placement.mode == "spread"
    urls, grpc_urls = config.triton_urls, config.triton_grpc_urls
    assert urls is not None and grpc_urls is not None
    seen_ports: set[int] = set()
    for i, triton in enumerate(tritons):
        args = dict(a.removeprefix("--").split("=", 1) for a in triton["args"])
        assert args["http-address"] == args["grpc-address"] == "127.0.0.1"
        assert urls[i] == f"127.0.0.1:{args['http-port']}"
        assert grpc_urls[i] == f"127.0.0.1:{args['grpc-port']}"
        ports = {int(args[k]) for k in ("http-port", "grpc-port", "metrics-port")}
        assert not ports & seen_ports
        seen_ports |= ports
        # Triton i runs on NVML GPU i: pinned in PCI bus order, NVML's order.
        assert env(triton)["CUDA_VISIBLE_DEVICES"] == str(i)
        assert env(triton)["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert "nvidia.com/gpu" not in triton["resources"].get("limits", {})
        assert triton["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert {"cpu", "memory"} <= set(triton["resources"]["requests"])
        assert "livenessProbe" in triton and "startupProbe" in triton
    # The sidecar holds the node's GPUs (so nothing else is scheduled on them), no capability.
    assert sidecar["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert "add" not in sidecar["securityContext"]["capabilities"]
    pod = one(build(OVERLAY), "Deployment")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.count": "4"}
