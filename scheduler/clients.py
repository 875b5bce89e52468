"""Client classes: each with its share of the traffic and its scheduling hints (``--clients``
of the simulator, ``--mix`` of the load generator)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from scheduler.weights import NICE_MAX, NICE_MIN


@dataclass(frozen=True)
class ClientSpec:
    """One class of clients: its share of the traffic and its scheduling hints."""

    name: str
    share: float = 1.0
    priority: int = 0
    nice: int = 0
    slo_ms: float | None = None  # None: the run's --slo-ms
    concurrency: int | None = None  # the load generator's closed loop: this class's own workers


def parse_clients(spec: str) -> list[ClientSpec]:
    """Parse ``"a:nice=-5,share=0.33;b:nice=0,share=0.33;c:priority=0,slo_ms=80"``.

    Shares are normalised to sum to 1; ValueError names the bad part. ``concurrency=N`` (the
    load generator's closed loops only) gives a class its own ``N`` workers.
    """
    clients: list[ClientSpec] = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        name, _, rest = part.partition(":")
        name = name.strip()
        if not name:
            raise ValueError(f"client spec {part!r}: a name comes before ':'")
        fields: dict[str, float] = {}
        for item in filter(None, (i.strip() for i in rest.split(","))):
            key, eq, value = item.partition("=")
            if not eq or key not in ("share", "priority", "nice", "slo_ms", "concurrency"):
                raise ValueError(
                    f"client {name!r}: {item!r} is not one of share=, priority=, nice=, "
                    "slo_ms=, concurrency="
                )
            try:
                fields[key] = float(value)
            except ValueError:
                raise ValueError(
                    f"client {name!r}: {key} must be a number, got {value!r}"
                ) from None
        client = ClientSpec(
            name=name,
            share=fields.get("share", 1.0),
            priority=int(fields.get("priority", 0)),
            nice=int(fields.get("nice", 0)),
            slo_ms=fields.get("slo_ms"),
            concurrency=None if "concurrency" not in fields else int(fields["concurrency"]),
        )
        if client.share <= 0:
            raise ValueError(f"client {name!r}: share must be > 0")
        if not NICE_MIN <= client.nice <= NICE_MAX:
            raise ValueError(f"client {name!r}: nice must be in {NICE_MIN}..{NICE_MAX}")
        if client.priority < 0:
            raise ValueError(f"client {name!r}: priority must be >= 0")
        if client.slo_ms is not None and client.slo_ms <= 0:
            raise ValueError(f"client {name!r}: slo_ms must be > 0")
        if client.concurrency is not None and client.concurrency < 1:
            raise ValueError(f"client {name!r}: concurrency must be >= 1")
        clients.append(client)
    if not clients:
        raise ValueError("no clients in spec")
    if len({c.name for c in clients}) != len(clients):
        raise ValueError("client names must be unique")
    total = sum(c.share for c in clients)
    return [replace(c, share=c.share / total) for c in clients]
