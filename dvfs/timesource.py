"""Injectable time: the simulator's virtual clock; the live stack uses ``time.monotonic``."""

from __future__ import annotations


class VirtualTime:
    """Seconds that move only when told to; call the instance to read it."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = start_s

    def __call__(self) -> float:
        return self._now_s

    def advance_to(self, t_s: float) -> None:
        if t_s < self._now_s:
            raise ValueError(f"virtual time cannot go back ({t_s} < {self._now_s})")
        self._now_s = t_s

    def advance_by(self, dt_s: float) -> None:
        self.advance_to(self._now_s + dt_s)
