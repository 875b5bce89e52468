"""``adaptive``: ``slack``'s plan, with the tail measured and the margins moved to hold it.

Everything ``slack`` does stays (every request's deadline in dispatch order, batches, phantom
arrivals, the tail margin, hysteresis, batch holds); what changes is the deadline it aims at.
Each SLO class (model, SLO) has a :class:`scheduler.feedback.TailController` that measures the
class's ``latency / SLO`` over a sliding window and scales the class's deadlines to hold its
attainment at the target (99% by default: a request that names an SLO expects its p99 under
it). The scale is shared by the class's queued, in-flight and phantom requests.
"""

from __future__ import annotations

import math
from collections import OrderedDict

from scheduler.feedback import FeedbackParams, TailController
from scheduler.policies import ModelPlan, SlackParams, SlackPolicy
from scheduler.view import QueuedRequest, SchedulerView

MAX_CLASSES = 64  # SLO classes tracked at once (clients choose SLOs: the oldest is forgotten)
TIGHTER = 0.9  # a new table whose plan needs less than this share of the old one's: re-earn room


def slo_class(model: str, slo_ms: float) -> tuple[str, float]:
    """The class a request's attainment counts in: its model and its SLO (to 0.1 ms)."""
    return model, round(slo_ms, 1)


def _need_ms(plan: ModelPlan) -> float:
    """What a plan expects one request alone to need, over the clocks: mean time plus margin."""
    return float(plan.times_ms[1].mean()) + plan.margin_ms


def _finite(x: float) -> float | None:
    """``x`` rounded, or None where nothing was measured (nan is not JSON)."""
    return round(x, 4) if math.isfinite(x) else None


class AdaptivePolicy(SlackPolicy):
    """``slack`` with a closed loop on each SLO class's tail (see the module docstring)."""

    name = "adaptive"

    def __init__(
        self,
        clocks_mhz: list[int],
        params: SlackParams | None = None,
        feedback: FeedbackParams | None = None,
    ) -> None:
        super().__init__(clocks_mhz, params)
        self.feedback = feedback or FeedbackParams()
        self.controllers: OrderedDict[tuple[str, float], TailController] = OrderedDict()
        self._need_before: dict[str, float] = {}  # model -> its plan's need, before new tables

    def _slo_scale(self, model: str, slo_ms: float) -> float:
        controller = self.controllers.get(slo_class(model, slo_ms))
        return self.feedback.start_scale if controller is None else controller.scale

    def controller(self, model: str, slo_ms: float) -> TailController:
        """The class's controller (created at its first completion)."""
        key = slo_class(model, slo_ms)
        controller = self.controllers.get(key)
        if controller is None:
            controller = self.controllers[key] = TailController(self.feedback)
            if len(self.controllers) > MAX_CLASSES:
                self.controllers.popitem(last=False)
        else:
            self.controllers.move_to_end(key)
        return controller

    def tables_changed(self) -> None:
        """Remember what each model's plan needed, to compare with its new table's."""
        for model, plan in self._plans.items():
            if plan is not None:
                self._need_before[model] = _need_ms(plan)
        super().tables_changed()

    def _plan(self, s: SchedulerView, model: str) -> ModelPlan | None:
        """The model's plan; when a new table makes it markedly more aggressive (a refit that
        found the model faster or its spread narrower), the room its classes had earned under
        the old table is taken back (scale at most the start): it was earned with the old
        margins, and keeping it on top of the new ones is what made live tails spike after a
        refit (docs/design.md, "The adaptive policy")."""
        fresh = model not in self._plans
        plan = super()._plan(s, model)
        before = self._need_before.pop(model, None)
        if fresh and plan is not None and before is not None and _need_ms(plan) < TIGHTER * before:
            for (m, _), controller in self.controllers.items():
                if m == model:
                    controller.rebase(self.feedback.start_scale)
        return plan

    def on_complete(self, s: SchedulerView, request: QueuedRequest, now_s: float) -> int | None:
        latency_ms = (now_s - request.arrival_s) * 1000.0
        moved = self.controller(request.model, request.slo_ms).observe(
            now_s, latency_ms, request.slo_ms
        )
        if moved:  # the deadlines the plan aims at moved: plan again now
            return self._decide(s, now_s)
        return super().on_complete(s, request, now_s)

    def model_scale(self, model: str) -> float | None:
        """The lowest scale of ``model``'s SLO classes (None: none has completed yet)."""
        scales = [c.scale for (m, _), c in self.controllers.items() if m == model]
        return min(scales, default=None)

    def state(self) -> list[dict[str, object]]:
        """Each class's scale and what its window measured, for the admin state."""
        return [
            {
                "model": model,
                "slo_ms": slo_ms,
                "scale": round(c.scale, 4),
                "attainment": _finite(c.attainment()),
                "tail_over_slo": _finite(c.tail_ratio()),
                "backoffs": c.backoffs,
                "raises": c.raises,
                "rebases": c.rebases,
            }
            for (model, slo_ms), c in self.controllers.items()
        ]

    def _floor_of(self, plan: ModelPlan) -> int | None:
        """The energy-optimal clock of a full batch, lower than batch 1's: running slower
        than batch 1's optimum is what lets batches fill (docs/design.md, "The adaptive
        policy")."""
        return plan.full_batch_floor_mhz
