"""The LLM engine's profile measured at the sidecar's first start (``--profile-engine MODEL``).

What ``python -m time2clock profile-engine`` does by hand, done by the sidecar before it serves:
seed 003's sweep of the GPU's clocks while it drives the engine's streams
(:func:`time2clock.engine.sweep_engine`), written to the state directory, one file per kind of
GPU and model, and read at every later start instead of measured again (as the embedded
default's CNN tables are). A cached file that cannot be used (another version, a GPU with other
clocks) is measured again, with a warning saying why.

The engine is the OpenAI-compatible upstream when one is configured (``/v1/completions``), else
the GPU's Triton (``generate_stream``). Nothing else should drive it meanwhile: the sidecar does
not serve until the sweep is done, and the GPU's clock is given back after it whatever happens.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path

from dvfs.device import Device
from loadgen.stream import GenTarget
from time2clock.engine import (
    EngineProfileError,
    EngineSweepSettings,
    check_clocks,
    load_engine_profile,
    measure_engine_profile,
)
from time2clock.profile import select_clocks

log = logging.getLogger(__name__)
OPENAI_ENDPOINT = "openai-completions"
TRITON_ENDPOINT = "generate_stream"


def cached_path(state_dir: Path, gpu_name: str, model: str) -> Path:
    """Where the profile of ``model``'s engine on a GPU of kind ``gpu_name`` is kept."""

    def safe(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "_"

    return state_dir / "engines" / f"{safe(gpu_name)}--{safe(model)}.json"


def engine_target(
    model: str, triton_url: str, openai_url: str | None, extra: Mapping[str, object]
) -> GenTarget:
    """The engine to sweep: the OpenAI-compatible upstream if there is one, else Triton."""
    if openai_url is not None:
        return GenTarget(openai_url.rstrip("/"), OPENAI_ENDPOINT, model, extra=extra)
    base = triton_url if "://" in triton_url else f"http://{triton_url}"
    return GenTarget(base.rstrip("/"), TRITON_ENDPOINT, model, extra=extra)


async def engine_profile_at_start(
    device: Device,
    gpu_name: str,
    target: GenTarget,
    *,
    state_dir: Path,
    clocks: int,
    settings: EngineSweepSettings | None = None,
) -> Path:
    """The path of a usable profile of ``target``'s engine on ``device``: the cached one, or
    one measured now (minutes: ``clocks`` clocks, the sweep's buckets and prompts at each).
    :class:`time2clock.profile.MeasureError` when the engine cannot be measured."""
    path = cached_path(state_dir, gpu_name, target.model)
    ladder = device.supported_clocks_mhz()
    if path.exists():
        try:
            check_clocks(load_engine_profile(path), ladder, str(path))
            log.info("using the cached engine profile %s", path)
            return path
        except EngineProfileError as err:
            log.warning("measuring the engine again: the cached profile is unusable: %s", err)
    chosen = select_clocks(ladder, clocks)
    settings = settings or EngineSweepSettings()
    log.info(
        "profiling the LLM engine %s (%s) on %s at %d clocks before serving; cached at %s",
        target.model, target.url, gpu_name, len(chosen), path,
    )  # fmt: skip

    def progress(done: int, total: int) -> None:
        log.info("engine profile: %d of %d runs", done, total)

    await measure_engine_profile(
        path, device, target, chosen, settings, gpu=gpu_name, progress=progress,
        by="the sidecar at start (--profile-engine)",
    )  # fmt: skip
    log.info("cached the engine profile at %s", path)
    return path
