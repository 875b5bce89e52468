"""The sidecar's second gRPC hop: to Triton over gRPC (as it is) or over HTTP (translated); and
the whole gRPC path on HTTP/2 of its own.

The sidecar passes a gRPC ``ModelInfer`` on to Triton over a ``grpc.aio`` channel, the client's
bytes as they came, and returns Triton's reply as Triton encoded it. Its own HTTP client to
Triton costs a fraction of a ``grpc.aio`` client's CPU per call, so the second hop could go
over HTTP instead, at the price of translating every request and reply (the byte-for-byte
passthrough and Triton's own gRPC statuses and messages given up). This measures what that
would save before anyone builds it.

``python -m benchmarks.grpchop`` starts the embedded Triton and, in a process of its own, a
``grpc.aio`` front end whose one handler sends each ``ModelInfer`` to Triton's ``noop`` either
as the sidecar does (``grpc``: the bytes over one ``grpc.aio`` channel) or translated
(``http``: the request decoded, sent with the binary tensor extension through the sidecar's own
HTTP client, :class:`api.upstream.Upstream`, and the reply encoded back into a
``ModelInferResponse``). Closed loops of one ``grpc.aio`` client against each in turn; printed:
the front end's CPU per call (its own ``/proc`` accounting) and its calls per second. The
translation covers what the measurement sends (raw input tensors, every output in binary): it
is the least a full one would cost, not a full one.

A third front end (``h2``) has neither end on grpcio: :mod:`benchmarks.h2floor`'s server,
passing each call's bytes to Triton's gRPC port over that module's client. It is a floor (no
admission, no scheduling, none of what the module lists as not done), measured as the others.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import uvloop
from tritonclient.grpc import service_pb2

from api.embedded import EmbeddedTriton, free_port, require_embedded
from api.grpc_frontend.protocol import MODEL_INFER, method_path
from api.hints import HEADER_LENGTH
from api.upstream import Upstream
from benchmarks.floor import model_infer_server, ready_until_stdin_closes, server_process
from benchmarks.grpcfloor import load
from benchmarks.h2floor import UnaryGrpcClient, unary_server
from dvfs.simulated import SimulatedDevice
from simulator.results import DEFAULT_DIR, markdown_table, write_results

HOPS = ("grpc", "http", "h2")
Infer = Callable[[bytes, Any], Awaitable[bytes]]
COLUMNS = [
    "concurrency",
    "front end CPU µs/call, gRPC hop",
    "HTTP hop",
    "saved",
    "HTTP/2 of its own",
    "calls/s, gRPC hop",
    "HTTP hop",
    "HTTP/2 of its own",
]


def http_request(request: Any) -> tuple[str, bytes, dict[str, str]]:
    """A ``ModelInferRequest`` with raw input tensors as Triton's HTTP binary extension sends
    it: the path, the body (JSON header, then the tensors' bytes) and its headers."""
    inputs = [
        {
            "name": t.name,
            "shape": list(t.shape),
            "datatype": t.datatype,
            "parameters": {"binary_data_size": len(raw)},
        }
        for t, raw in zip(request.inputs, request.raw_input_contents, strict=True)
    ]
    head: dict[str, Any] = {"inputs": inputs, "parameters": {"binary_data_output": True}}
    if request.id:
        head["id"] = request.id
    if request.outputs:
        head["outputs"] = [
            {"name": o.name, "parameters": {"binary_data": True}} for o in request.outputs
        ]
    header = json.dumps(head, separators=(",", ":")).encode()
    headers = {HEADER_LENGTH: str(len(header)), "content-type": "application/octet-stream"}
    body = b"".join([header, *request.raw_input_contents])
    return f"/v2/models/{request.model_name}/infer", body, headers


def grpc_reply(body: bytes, header_length: int) -> bytes:
    """Triton's HTTP reply (JSON header, then every output's bytes) as a ``ModelInferResponse``."""
    head = json.loads(body[:header_length])
    reply = service_pb2.ModelInferResponse(
        model_name=head["model_name"],
        model_version=head.get("model_version", ""),
        id=head.get("id", ""),
    )
    offset = header_length
    for out in head["outputs"]:
        size = out["parameters"]["binary_data_size"]
        tensor = reply.outputs.add(name=out["name"], datatype=out["datatype"])
        tensor.shape.extend(out["shape"])
        reply.raw_output_contents.append(body[offset : offset + size])
        offset += size
    return bytes(reply.SerializeToString())


async def handler(hop: str, triton_http: str, triton_grpc: str) -> tuple[Infer, Any]:
    """The front end's ``ModelInfer`` for ``hop``, and what to close after."""
    if hop == "http":
        upstream = Upstream(triton_http, keep_headers=(HEADER_LENGTH,))
        await upstream.open()

        async def translated(raw: bytes, _: Any) -> bytes:
            path, body, headers = http_request(service_pb2.ModelInferRequest.FromString(raw))
            reply = await upstream.request("POST", path, body, headers)
            if reply.status != 200:
                raise RuntimeError(f"Triton answered {reply.status}: {reply.body[:200]!r}")
            return grpc_reply(reply.body, int(reply.headers.get(HEADER_LENGTH, len(reply.body))))

        return translated, upstream

    channel = grpc.aio.insecure_channel(triton_grpc)
    call = channel.unary_unary(method_path(MODEL_INFER))

    async def passed(raw: bytes, _: Any) -> bytes:
        reply: bytes = await call(raw)
        return reply

    return passed, channel


async def serve(hop: str, port: int, triton_http: str, triton_grpc: str) -> None:
    """The front end, until stdin closes."""
    if hop == "h2":
        await serve_h2(port, triton_grpc)
        return
    infer, upstream = await handler(hop, triton_http, triton_grpc)
    server = await model_infer_server(port, infer)
    await ready_until_stdin_closes()
    await server.stop(0)
    await upstream.close()


async def serve_h2(port: int, triton_grpc: str) -> None:
    """The ``h2`` front end: the least HTTP/2 server in Python passing each call's bytes to
    Triton's gRPC port over the least HTTP/2 client (:mod:`benchmarks.h2floor`), until stdin
    closes: the floor of a sidecar gRPC path with neither end on grpcio."""
    host, grpc_port = triton_grpc.removeprefix("grpc://").rsplit(":", 1)
    path = method_path(MODEL_INFER)
    async with UnaryGrpcClient(host, int(grpc_port)) as triton:
        server = await unary_server(port, {path: lambda raw: triton.call(path, raw)})
        await ready_until_stdin_closes()
        server.close()


def measure(
    concurrencies: list[int], duration_s: float, rounds: int, triton: EmbeddedTriton
) -> list[dict[str, Any]]:
    """Each hop at each concurrency, ``rounds`` times in alternation; medians per cell."""
    runs: dict[tuple[str, int], list[dict[str, float]]] = {}
    for r in range(rounds):
        for hop in HOPS if r % 2 == 0 else HOPS[::-1]:
            port = free_port()
            args = ("--serve", str(port), "--hop", hop, triton.url, triton.ports.grpc_url)
            with server_process(f"the {hop} front end", "benchmarks.grpchop", *args) as (p, _):
                for c in concurrencies:
                    # the front end is load's server: its CPU is server_cpu_us
                    got = uvloop.run(load(f"127.0.0.1:{port}", c, duration_s, p.pid))
                    runs.setdefault((hop, c), []).append(got)
                    print(
                        f"  round {r + 1}, Triton over {hop:>4}, concurrency {c:>2}: "
                        f"{got['calls_per_s']:.0f} calls/s, front end CPU "
                        f"{got['server_cpu_us']:.0f} µs per call",
                        flush=True,
                    )
    return [
        {
            "hop": hop,
            "concurrency": c,
            **{k: float(np.median([g[k] for g in got])) for k in ("calls_per_s", "server_cpu_us")},
        }
        for (hop, c), got in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0]))
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.grpchop", description=__doc__)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--results-dir", type=Path, default=DEFAULT_DIR, help="where grpchop.{md,json} go"
    )
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the front end's process
    parser.add_argument("--hop", choices=HOPS, default="grpc", help=argparse.SUPPRESS)
    parser.add_argument("triton", nargs="*", help=argparse.SUPPRESS)  # its Triton: HTTP, gRPC
    args = parser.parse_args(argv)
    if args.serve is not None:
        uvloop.run(serve(args.hop, args.serve, *args.triton))
        return 0
    if args.rounds < 1 or args.duration_s <= 0:
        parser.error("--rounds must be >= 1 and --duration-s > 0")
    concurrencies = [int(x) for x in args.concurrency.split(",")]
    require_embedded()
    print("The second hop to Triton's noop: over gRPC (passed on) or over HTTP (translated):")
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "gpu.state"
        device = SimulatedDevice("v100", state_path=state)
        try:
            with EmbeddedTriton(state) as triton:
                rows = measure(concurrencies, args.duration_s, args.rounds, triton)
        finally:
            device.close()
    by = {(r["hop"], r["concurrency"]): r for r in rows}
    md, _ = write_results(
        "grpchop",
        title="The second gRPC hop: Triton over gRPC or over HTTP (python -m benchmarks.grpchop)",
        markdown="A grpc.aio front end (its own process) sending each `ModelInfer` to the "
        "embedded Triton's `noop` over gRPC (the bytes passed on, as the sidecar does) or over "
        "HTTP (translated to the binary tensor extension and back, through the sidecar's HTTP "
        "client); beside them, *HTTP/2 of its own*: the least HTTP/2 server in Python on "
        "uvloop passing the bytes to Triton's gRPC port over the least HTTP/2 client "
        "(`benchmarks/h2floor.py`), the floor of a gRPC path with neither end on grpcio. "
        f"One grpc.aio client in closed loops of {args.duration_s:g} s, the front ends "
        f"alternating, medians over {args.rounds} rounds. CPU: the front end's own per call. "
        "*Saved*: what the HTTP hop saves per call.\n\n"
        + markdown_table(
            COLUMNS,
            [
                (
                    c,
                    f"{by['grpc', c]['server_cpu_us']:.0f}",
                    f"{by['http', c]['server_cpu_us']:.0f}",
                    f"{by['grpc', c]['server_cpu_us'] - by['http', c]['server_cpu_us']:.0f}",
                    f"{by['h2', c]['server_cpu_us']:.0f}",
                    f"{by['grpc', c]['calls_per_s']:.0f}",
                    f"{by['http', c]['calls_per_s']:.0f}",
                    f"{by['h2', c]['calls_per_s']:.0f}",
                )
                for c in concurrencies
            ],
        ),
        data={
            "settings": {"duration_s": args.duration_s, "rounds": args.rounds},
            "cost": rows,
        },
        directory=args.results_dir,
    )
    print(f"written to {md} (and .json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
