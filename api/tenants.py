"""Who may claim what: bearer tokens mapped to a client id and the scheduling rights it has.

Without a tenants file the sidecar trusts its network: any client may send any ``priority``,
``nice`` and ``client_id`` (fine behind a gateway that sets them, not on an open network).
With ``--tenants FILE`` (TOML)::

    [defaults]              # clients without a token
    highest_priority = 0    # 0: the default level only (1 would be the top level)
    lowest_nice = 0
    slo_ms = 100

    [[tenant]]
    token = "…"             # or token_sha256 = "<hex>", so the file holds no secret
    client_id = "search"
    highest_priority = 1    # may ask for level 1 (the top)
    lowest_nice = -5
    slo_ms = 40             # its requests' SLO when they name none

a request's ``Authorization: Bearer <token>`` picks its tenant, whose ``client_id`` it gets
whatever it asked for. A priority above what it may claim is lowered to the highest it may
claim, a nice below its lowest is raised to it (as Linux clamps an unprivileged nice). Clients
without a token are held to ``[defaults]`` and cannot take a tenant's ``client_id``; a token
that matches no tenant is refused (401).
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from api.hints import Hints
from scheduler.weights import NICE_MAX, NICE_MIN

ANONYMOUS = "anonymous"


class UnknownTokenError(Exception):
    """A bearer token that matches no tenant."""


@dataclass(frozen=True)
class Rights:
    """What one tenant (or an unknown client) may claim."""

    client_id: str | None
    highest_priority: int = 0  # a level number (1 the top); 0: the default level only
    lowest_nice: int = 0
    slo_ms: float | None = None

    def apply(self, hints: Hints) -> Hints:
        priority = hints.priority
        if priority and (not self.highest_priority or priority < self.highest_priority):
            priority = self.highest_priority
        return replace(
            hints,
            priority=priority,
            nice=max(hints.nice, self.lowest_nice),
            slo_ms=hints.slo_ms if hints.slo_ms is not None else self.slo_ms,
            client_id=self.client_id or hints.client_id,
        )


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _rights(entry: dict[str, Any], where: str, client_id: str | None) -> Rights:
    def number(key: str, lo: int, hi: int) -> int:
        value = entry.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ValueError(f"{where}: {key} must be an integer in {lo}..{hi}, got {value!r}")
        return value

    slo = entry.get("slo_ms")
    if slo is not None and (isinstance(slo, bool) or not isinstance(slo, int | float) or slo <= 0):
        raise ValueError(f"{where}: slo_ms must be a positive number, got {slo!r}")
    return Rights(
        client_id=client_id,
        highest_priority=number("highest_priority", 0, 1_000),
        lowest_nice=number("lowest_nice", NICE_MIN, NICE_MAX),
        slo_ms=None if slo is None else float(slo),
    )


class Tenants:
    """The tenants file, loaded once (``--tenants``)."""

    def __init__(self, defaults: Rights, by_digest: dict[str, Rights]) -> None:
        self.defaults = defaults
        self._by_digest = by_digest
        self._ids = {r.client_id for r in by_digest.values()}

    @classmethod
    def load(cls, path: Path) -> Tenants:
        """Read and check the file; ValueError names the file and the bad entry."""
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
            raise ValueError(f"--tenants {path}: {err}") from None
        defaults = _rights(data.get("defaults", {}), f"{path} [defaults]", None)
        by_digest: dict[str, Rights] = {}
        for i, entry in enumerate(data.get("tenant", [])):
            where = f"{path} [[tenant]] #{i + 1}"
            client_id = entry.get("client_id")
            if not isinstance(client_id, str) or not 0 < len(client_id) <= 128:
                raise ValueError(f"{where}: client_id must be a string of 1..128 characters")
            token, digest = entry.get("token"), entry.get("token_sha256")
            if isinstance(token, str) and token:
                digest = _digest(token)
            if not isinstance(digest, str) or len(digest) != 64:
                raise ValueError(f"{where}: needs token or token_sha256 (64 hex digits)")
            if digest.lower() in by_digest:
                raise ValueError(f"{where}: the same token as another tenant")
            by_digest[digest.lower()] = _rights(entry, where, client_id)
        return cls(defaults, by_digest)

    def apply(self, hints: Hints, authorization: str | None) -> Hints:
        """``hints`` as this client may have them (see the module docstring)."""
        if authorization:
            scheme, _, token = authorization.partition(" ")
            rights = (
                self._by_digest.get(_digest(token.strip())) if scheme.lower() == "bearer" else None
            )
            if rights is None:
                raise UnknownTokenError("the bearer token matches no tenant")
            return rights.apply(hints)
        held = self.defaults.apply(hints)
        if held.client_id in self._ids:
            held = replace(held, client_id=ANONYMOUS)
        return held
