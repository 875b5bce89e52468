"""Client classes (``--mix``): each with its share of the traffic and its scheduling hints."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.clients import parse_clients


@dataclass(frozen=True)
class RequestClass:
    """Requests sent with the same hints; ``name`` doubles as the ``client_id``."""

    name: str = "default"
    share: float = 1.0
    priority: int = 0
    nice: int | None = None
    slo_ms: float | None = None
    concurrency: int | None = None  # closed loop: this class's own workers

    def parameters(self) -> dict[str, object]:
        """The request's ``parameters`` (``priority`` travels separately, as Triton has it)."""
        params: dict[str, object] = {"client_id": self.name}
        if self.nice is not None:
            params["nice"] = self.nice
        if self.slo_ms is not None:
            params["slo_ms"] = self.slo_ms
        return params


def parse_mix(spec: str, default_slo_ms: float | None = None) -> list[RequestClass]:
    """``"a:share=0.3,priority=1,slo_ms=50;b:nice=5"`` (the simulator's client syntax), with
    ``concurrency=N`` giving a class its own closed loop (every class or none)."""
    classes = [
        RequestClass(c.name, c.share, c.priority, c.nice, c.slo_ms or default_slo_ms, c.concurrency)
        for c in parse_clients(spec)
    ]
    if len({c.concurrency is None for c in classes}) > 1:
        raise ValueError("--mix: give concurrency= to every class or to none")
    return classes
