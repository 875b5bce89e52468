"""Live, on the embedded default: the sidecar reads simnet's priority levels from Triton's
config, and sends a burst no more than a full batch before the first is nearly done, so that
requests whose clients leave are not executed for nobody."""

from __future__ import annotations

import asyncio
from pathlib import Path

from api.embedded import SIMNET
from benchmarks.priority import abandon_check
from tests.api.live import LiveSidecar, embedded_config, simnet_tables

TOKEN = "test-token"
INPUT = {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}


def test_departed_clients_cost_at_most_a_batch(tmp_path: Path) -> None:
    """The clock at its lowest (a batch of 1 takes about 45 ms, of 32 about 250 ms), 100
    requests whose clients give up after 0.1 s (``python -m benchmarks.priority``'s abandon
    check): Triton executes what it held when they left (before, with three batches' worth at
    Triton, it executed all 100). Then one request at each of two levels: simnet's batcher
    orders them (two Triton priority levels), so the depth stays two batches."""
    table = tmp_path / "v100.json"
    simnet_tables("v100").save(table)
    config = embedded_config(tmp_path, table=(table,), policy="max", max_queue=1000, learn=False)
    with LiveSidecar(config) as sc:
        state = sc.get("/admin/state", headers={"Authorization": f"Bearer {TOKEN}"}).json()
        simnet = state["models"][SIMNET]
        assert simnet["triton_priority_levels"] == 2  # read from Triton's config
        # one level alone: two full batches once the first is nearly done; a burst gets one
        assert simnet["depth"] == 2 * simnet["max_batch"] == 64
        assert sc.runtime.embedded is not None
        check = asyncio.run(
            abandon_check(sc.url, sc.runtime.embedded.url, TOKEN, n=100, patience_s=0.1)
        )
        ran, nobody = check["executed_by_triton"], check["executed_for_nobody"]
        batch = simnet["max_batch"]
        assert check["served_in_time"] + check["gave_up"] == 100
        assert ran <= 2 * batch, f"Triton executed {ran} of 100"
        # A batch's worth, and the few released in the moment before the sidecar has seen
        # their clients leave (up to 4 in runs with both cores of a 2-core machine busy).
        assert nobody <= batch + batch // 4, f"{nobody} executed for nobody ({ran} in all)"
        # Two levels of simnet alone, which its batcher orders: still two batches once due.
        for priority in (1, 0):
            body = {"inputs": [INPUT], "parameters": {"priority": priority}}
            assert sc.post(f"/v2/models/{SIMNET}/infer", json=body).status_code == 200
        state = sc.get("/admin/state", headers={"Authorization": f"Bearer {TOKEN}"}).json()
        assert state["models"][SIMNET]["depth"] == 2 * batch
