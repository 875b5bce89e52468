"""Which models Triton serves, and what their configs allow: cached, refreshed on a miss.

Names come from Triton's repository index (``POST /v2/repository/index``, asked again at most
once per ``refresh_s``), and, for a name the index does not list (PyTriton's index is empty; a
Triton may restrict it), from ``GET /v2/models/<m>``: positives are remembered, negatives for
``refresh_s`` (a flood of one made-up name costs Triton one call a second). Anything else a
client names is unknown: 404, and the metric label ``unknown``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from api.metrics import sanitize_label
from api.tensors import ModelLimits
from api.upstream import Upstream
from api.upstream_errors import UpstreamUnavailableError

log = logging.getLogger(__name__)
UNKNOWN = "unknown"
MAX_REFUSED = 4096
MAX_NAME_CHARS = 256


class ModelIndex:
    """Known model names and their per-input element bounds."""

    def __init__(
        self,
        upstream: Callable[[], Upstream | None],
        *,
        refresh_s: float = 1.0,
        time_source: Callable[[], float] = time.monotonic,
        on_config: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        """``on_config(model, config)`` hears each model's config the first time it is read."""
        self._upstream = upstream
        self._on_config = on_config
        self.refresh_s = refresh_s
        self._now = time_source
        self.known: set[str] = set()
        self._labels: dict[str, str] = {}  # known name -> its label
        self._limits: dict[str, ModelLimits] = {}
        self._refreshed_at_s: float | None = None
        self._index_allowed = True
        self._refused: dict[str, float] = {}  # unknown names, asked again after refresh_s

    def label(self, model: str) -> str:
        """The metric label for ``model``: its name when Triton serves it, else ``unknown``."""
        label = self._labels.get(model)
        if label is not None:
            return label
        if model not in self.known:
            return UNKNOWN
        label = self._labels[model] = sanitize_label(model)
        return label

    def cached_limits(self, model: str) -> ModelLimits | None:
        """The model's bounds if its config has been read already (None: ask :meth:`limits`)."""
        return self._limits.get(model)

    async def exists(self, model: str) -> bool:
        """Whether Triton serves ``model``; True when Triton cannot be asked (the request then
        fails with 503, not with a 404 that would be a guess)."""
        if model in self.known:
            return True
        if len(model) > MAX_NAME_CHARS or not model.isprintable():
            return False  # no Triton model is named so; not worth asking
        now = self._now()
        refused_at = self._refused.get(model)
        if refused_at is not None and now - refused_at < self.refresh_s:
            return False
        upstream = self._upstream()
        if upstream is None:
            return True
        try:
            if self._index_allowed and (
                self._refreshed_at_s is None or now - self._refreshed_at_s >= self.refresh_s
            ):
                self._refreshed_at_s = now
                await self._refresh(upstream)
                if model in self.known:
                    return True
            # Not (yet) in the index: some Tritons list no models there (PyTriton's is empty).
            resp = await upstream.request("GET", f"/v2/models/{model}", timeout_s=5.0)
        except UpstreamUnavailableError:
            return True
        if resp.status == 200:
            self.known.add(model)
            return True
        if len(self._refused) >= MAX_REFUSED:
            self._refused.clear()
        self._refused[model] = now
        return False

    async def _refresh(self, upstream: Upstream) -> None:
        resp = await upstream.request("POST", "/v2/repository/index", b"{}", timeout_s=5.0)
        if resp.status != 200:
            log.info("Triton's repository index answers %d: asking per model", resp.status)
            self._index_allowed = False
            return
        try:
            entries = json.loads(resp.body)
        except ValueError:
            entries = []
        names = {
            e["name"] for e in entries if isinstance(e, dict) and isinstance(e.get("name"), str)
        }
        self.known |= names

    async def names(self) -> list[str]:
        """Every model known to be served: the repository index (refreshed), and those asked
        for by name."""
        upstream = self._upstream()
        if upstream is not None and self._index_allowed:
            try:
                self._refreshed_at_s = self._now()
                await self._refresh(upstream)
            except UpstreamUnavailableError:
                pass
        return sorted(self.known)

    async def limits(self, model: str) -> ModelLimits | None:
        """The per-input bounds from the model's config (asked once), or None if Triton gives
        no config."""
        if model in self._limits:
            return self._limits[model]
        upstream = self._upstream()
        if upstream is None:
            return None
        try:
            resp = await upstream.request("GET", f"/v2/models/{model}/config", timeout_s=5.0)
        except UpstreamUnavailableError:
            return None
        if resp.status != 200:
            return None
        try:
            config = json.loads(resp.body)
        except ValueError:
            return None
        if not isinstance(config, dict):
            return None
        limits = self._limits[model] = ModelLimits.from_config(config)
        if self._on_config is not None:
            self._on_config(model, config)
        return limits

    def forget(self) -> None:
        """Triton restarted: its models may have changed."""
        self._limits.clear()
        self._refreshed_at_s = None
