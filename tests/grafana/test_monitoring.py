"""The dashboards and rules against a real Prometheus scraping the real stack under load."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from api.config import GatewayConfig
from api.embedded import INPUT_WIDTH, SIMNET, free_port
from api.server import SidecarServer
from loadgen.classes import RequestClass
from loadgen.engine import (
    Payload,
    Recorder,
    Target,
    build_payloads,
    new_session,
    open_loop,
    schedule,
)
from tests.api.live import embedded_config

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "grafana"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None,
    reason="Prometheus is not installed (make test installs Debian's package)",
)
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
# Panels fed by NVIDIA's DCGM exporter: no exporter runs without a GPU, so these queries are
# checked for validity, not for data.
EXTERNAL = ("$dcgm_",)


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], input=stdin, capture_output=True, text=True, timeout=60
    )


def test_promtool_accepts_config_and_rules() -> None:
    check = promtool("check", "config", str(GRAFANA / "prometheus" / "prometheus.yml"))
    assert check.returncode == 0, check.stdout + check.stderr
    check = promtool("check", "rules", str(GRAFANA / "prometheus" / "rules.yml"))
    assert check.returncode == 0, check.stdout + check.stderr


def test_dashboards_load_in_a_stock_grafana() -> None:
    uids = set()
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        assert board["uid"] not in uids
        uids.add(board["uid"])
        names = {v["name"] for v in board["templating"]["list"]}
        for panel in board["panels"]:
            if panel["type"] == "row":
                continue
            assert panel["datasource"] == {"type": "prometheus", "uid": "prometheus"}
            assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
            for target in panel["targets"]:
                used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval"}
                assert used <= names, f"{panel['title']}: undefined variables {used - names}"
    provisioning = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    assert provisioning["datasources"][0]["uid"] == "prometheus"


def panel_queries() -> list[tuple[str, str, str, bool]]:
    """(dashboard, panel title, PromQL with the variables filled as 'All' and defaults, whether
    it reads an external exporter)."""
    out = []
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        defaults = {
            v["name"]: v["query"] for v in board["templating"]["list"] if v["type"] == "textbox"
        }
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"].replace("$__rate_interval", "15s")
                for name, value in defaults.items():
                    expr = expr.replace(f"${name}", value)
                expr = re.sub(r"\$\w+", ".*", expr)
                external = any(mark in target["expr"] for mark in EXTERNAL)
                out.append((path.stem, panel["title"], expr, external))
    return out


def started(stack: contextlib.ExitStack, config: GatewayConfig, starts: int = 3) -> SidecarServer:
    """A sidecar in ``stack``; one that fails during start-up (its embedded Tritons' handshake
    can time out on a loaded 2-core machine) is started again, up to ``starts`` times in all."""
    for attempt in range(1, starts + 1):
        sc = SidecarServer(config)
        try:
            return stack.enter_context(sc)
        except RuntimeError:
            sc.close()  # its listening socket; the runtime stopped what it had started
            if attempt == starts:
                raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def monitored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The stack under load from two clients, scraped every second by a real Prometheus: one
    sidecar driving two simulated GPUs (the per-GPU panels' data); beside it a second sidecar
    in shadow mode in front of GPU 0's Triton (the shadow panels' data)."""
    tmp = tmp_path_factory.mktemp("monitoring")
    config = embedded_config(tmp, max_queue=1000, port=0, grpc_port=0, device="sim:v100x2")
    with contextlib.ExitStack() as stack:
        sc = started(stack, config)
        assert sc.runtime.embedded is not None
        shadow = replace(
            config,
            triton_url=sc.runtime.embedded.url,
            device="sim:v100",
            shadow=True,
            table=tuple((tmp / "tables").glob("*.json")),
        )
        shadow_sc = started(stack, shadow)
        # A third, on a simulated H100, serving the embedded LLM (the generative panels' data).
        llm_config = embedded_config(
            tmp / "llm", device="sim:h100", profile_models=(), port=0, grpc_port=0
        )
        llm_sc = started(stack, llm_config)
        triton_metrics = f"127.0.0.1:{sc.runtime.embedded.ports.metrics}"
        prom_config = yaml.safe_load((GRAFANA / "prometheus" / "prometheus.yml").read_text())
        prom_config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        prom_config["rule_files"] = [str(GRAFANA / "prometheus" / "rules.yml")]
        targets = {
            "sidecar": [sc.url, shadow_sc.url, llm_sc.url],
            "triton": [triton_metrics],
            "dcgm": [f"127.0.0.1:{free_port()}"],
        }
        for job in prom_config["scrape_configs"]:
            job["static_configs"][0]["targets"] = targets[job["job_name"]]
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(prom_config))
        port = free_port()
        assert PROMETHEUS is not None
        prom = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            drivers = [
                threading.Thread(target=_drive, args=(url, 12.0, rate))
                for url, rate in ((sc.url, 50.0), (shadow_sc.url, 20.0))
            ]
            drivers += [threading.Thread(target=_stream, args=(llm_sc.url, 12.0)) for _ in range(4)]
            for driver in drivers:
                driver.start()
            for driver in drivers:
                driver.join()
            stop = threading.Event()
            trickle = threading.Thread(
                target=_trickle, args=([sc.url, shadow_sc.url], llm_sc.url, stop)
            )
            trickle.start()
            try:
                yield f"http://127.0.0.1:{port}"
            finally:
                stop.set()
                trickle.join(60)
        finally:
            prom.terminate()
            prom.wait(30)


CLASSES = (RequestClass("gold", 0.5, 1, -5, 60.0), RequestClass("bulk", 0.5, 0, 5, 60.0))
STREAM = {  # a stream of tokens with token SLOs (one in three missed)
    "text_input": "a b c d",
    "max_tokens": 24,
    "parameters": {"ttft_ms": 1000, "tpot_ms": 8},
}


def _payloads() -> list[Payload]:
    """One inference request of each class, as the load generator sends it."""
    return build_payloads(CLASSES, data=np.ones((1, INPUT_WIDTH), dtype=np.float32))


def _drive(url: str, seconds: float, rate_rps: float) -> None:
    target = Target(url, SIMNET, _payloads(), [0.5, 0.5])
    # Requests that are not served: a bad hint (400) and an unknown model (404).
    httpx.post(
        f"http://{url}/v2/models/simnet/infer", json={"inputs": [], "parameters": {"nice": 99}}
    )
    httpx.post(f"http://{url}/v2/models/ghost/infer", json={"inputs": []})

    async def go() -> None:
        async with new_session() as session:
            times = schedule(rate_rps, seconds, "poisson", np.random.default_rng(1))
            await open_loop(session, target, times, Recorder(), np.random.default_rng(2))

    worker = threading.Thread(target=asyncio.run, args=(go(),))
    worker.start()
    worker.join(seconds + 60)


def _stream(url: str, seconds: float) -> None:
    """Streams of tokens, one after another."""
    end = time.monotonic() + seconds
    with httpx.Client(timeout=30) as client:
        while time.monotonic() < end:
            client.post(f"http://{url}/v2/models/simllm/generate_stream", json=STREAM)


def _trickle(urls: list[str], llm_url: str, stop: threading.Event) -> None:
    """After the load, a request of each class to each sidecar and a stream to the LLM's every
    half second, until ``stop``: a rule that keeps only what was served in the last minute
    (``> 0`` on a rate) keeps every client however long the tests take to reach it."""
    payloads = _payloads()
    with httpx.Client(timeout=30) as client:
        while not stop.wait(0.5):
            for url in urls:
                for p in payloads:
                    client.post(
                        f"http://{url}/v2/models/{SIMNET}/infer", content=p.body, headers=p.headers
                    )
            client.post(f"http://{llm_url}/v2/models/simllm/generate_stream", json=STREAM)


def query(prom: str, expr: str) -> list[object]:
    reply = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=30).json()
    assert reply["status"] == "success", f"{expr}: {reply}"
    result: list[object] = reply["data"]["result"]
    return result


@pytest.mark.parametrize(
    ("board", "title", "expr", "external"), panel_queries(), ids=lambda v: str(v)[:40]
)
def test_every_panel_query_returns_data(
    monitored: str, board: str, title: str, expr: str, external: bool
) -> None:
    deadline = time.monotonic() + 30
    while True:
        result = query(monitored, expr)  # a PromQL error fails here, external or not
        if result or external:
            break
        assert time.monotonic() < deadline, f"{board} / {title}: no data for {expr}"
        time.sleep(1)


def test_the_per_gpu_row_shows_each_gpu_of_the_node(monitored: str) -> None:
    """Every panel of the overview's per-GPU row draws a series for each GPU the two-GPU
    sidecar drives, told apart by the ``gpu`` label."""
    deadline = time.monotonic() + 30
    while not (nodes := query(monitored, 'sidecar_placement_info{gpus="2"} == 1')):
        assert time.monotonic() < deadline, "no sidecar of two GPUs is scraped"
        time.sleep(1)
    (node,) = nodes
    instance = node["metric"]["instance"]  # type: ignore[index]
    board = json.loads((GRAFANA / "dashboards" / "overview.json").read_text())
    start = next(i for i, p in enumerate(board["panels"]) if p["title"].startswith("Per GPU"))
    panels = list(itertools.takewhile(lambda p: p["type"] != "row", board["panels"][start + 1 :]))
    exprs = [
        re.sub(r"\$\w+", ".*", t["expr"].replace("$__rate_interval", "15s"))
        for p in panels
        for t in p["targets"]
        if any("gpu" in re.split(r",\s*", by) for by in re.findall(r"by \(([^)]*)\)", t["expr"]))
    ]
    assert len(exprs) >= 5, exprs  # served, clock set and read, queue, in flight, power
    for expr in exprs:
        deadline = time.monotonic() + 30
        while True:
            gpus = {
                s["metric"]["gpu"]  # type: ignore[index]
                for s in query(monitored, expr)
                if s["metric"]["instance"] == instance  # type: ignore[index]
            }
            if gpus == {"0", "1"}:
                break
            assert time.monotonic() < deadline, f"{expr}: GPUs {gpus}"
            time.sleep(1)


def test_every_recording_rule_returns_data(monitored: str) -> None:
    rules = yaml.safe_load((GRAFANA / "prometheus" / "rules.yml").read_text())
    names = [r["record"] for g in rules["groups"] for r in g["rules"]]
    for name in names:
        deadline = time.monotonic() + 30
        while not query(monitored, name):
            assert time.monotonic() < deadline, f"recording rule {name} has no data"
            time.sleep(1)
    shares = {
        (s["metric"]["instance"], s["metric"]["client"]): float(s["value"][1])  # type: ignore[index]
        for s in query(monitored, "sidecar_client:entitled_share:ratio")
    }
    # gold (priority 1) and bulk (default level) are alone in their levels: entitled to all of
    # it; so is the generative sidecar's one client.
    assert {client for _, client in shares} == {"gold", "bulk", "default"}
    assert set(shares.values()) == {1.0}


def test_scraped_metrics_pass_promtool(monitored: str) -> None:
    targets = httpx.get(f"{monitored}/api/v1/targets").json()["data"]["activeTargets"]
    sidecars = [t for t in targets if t["labels"]["job"] == "sidecar"]
    assert len(sidecars) == 3  # active, shadow and generative
    for sidecar in sidecars:
        assert sidecar["health"] == "up"
        text = httpx.get(sidecar["scrapeUrl"]).text
        lint = promtool("check", "metrics", stdin=text)
        assert lint.returncode == 0 and not lint.stdout.strip(), lint.stdout + lint.stderr
