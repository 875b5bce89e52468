"""``simllm``: an emulated LLM served by the embedded Triton as a decoupled (streaming) model.

One :class:`dvfs.llm_engine.ContinuousBatchingEngine` per model runs iteration after iteration on
PyTriton's event loop: each iteration is priced by the GPU's :class:`dvfs.llm_profiles.LlmProfile`
at the clock the sidecar set (read from the simulated GPU's shared state), lasts that long, and
draws that power on the simulated GPU's energy counter (:meth:`SimulatedDevice.engine_power`).
Requests speak what Triton's LLM backends speak (vLLM's and TensorRT-LLM's): ``text_input``
(its whitespace-separated words are the prompt's tokens) and ``max_tokens`` (the output's length:
the engine generates exactly that many, as a benchmark with ``ignore_eos`` does), and each token
comes back as one response with ``text_output``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np

from dvfs.llm_engine import ContinuousBatchingEngine, Emitted, EngineLimits
from dvfs.llm_profiles import LLM_GPUS, LlmProfile, get_llm_profile
from dvfs.simulated import SimulatedDevice
from scheduler.tokens import EnginePrior

SIMLLM = "simllm"
MAX_PROMPT_TOKENS = 8192
MAX_OUTPUT_TOKENS = 4096


def prompt_tokens(text: str) -> int:
    """The prompt's length in tokens: its words (at least one)."""
    return max(1, len(text.split()))


class EmulatedLlm:
    """The engine of one emulated model, stepped in wall time on the running event loop."""

    def __init__(self, device: SimulatedDevice, profile: LlmProfile, limits: EngineLimits) -> None:
        self.device = device
        self.profile = profile
        self.engine = ContinuousBatchingEngine(limits)
        self._streams: dict[int, asyncio.Queue[Emitted]] = {}
        self._ids = itertools.count()
        self._wake: asyncio.Event | None = None
        self._runner: asyncio.Task[None] | None = None

    async def generate(self, prompt: int, output: int) -> AsyncIterator[Emitted]:
        """One request's tokens as the engine emits them; leaving early frees its place."""
        if self._wake is None:
            self._wake = asyncio.Event()
        if self._runner is None or self._runner.done():
            self._runner = asyncio.get_running_loop().create_task(self._run())
        request_id = next(self._ids)
        tokens: asyncio.Queue[Emitted] = asyncio.Queue()
        self._streams[request_id] = tokens
        self.engine.submit(request_id, prompt, output)
        self._wake.set()
        try:
            while True:
                token = await tokens.get()
                yield token
                if token.last:
                    return
        finally:
            self.engine.cancel(request_id)
            self._streams.pop(request_id, None)

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            iteration = self.engine.next_iteration()
            if iteration is None:
                await asyncio.to_thread(self.device.engine_power, None)
                self._wake.clear()
                await self._wake.wait()
                continue
            clock_mhz = self.device.clock_mhz()
            cost = self.profile.cost(iteration.work, clock_mhz)
            self.device.engine_power(cost.power_w)
            await asyncio.sleep(cost.time_ms / 1000.0)
            for token in self.engine.finish_iteration():
                stream = self._streams.get(token.request_id)
                if stream is not None:
                    stream.put_nowait(token)


def engine_prior(gpu: str) -> EnginePrior | None:
    """The emulated engine's offline profile on simulated GPU ``gpu`` (None: it has no LLM
    profile): seed 003's sweep of the same laws the engine runs, as the simulator profiles it.
    Another engine is profiled through its endpoint by ``python -m time2clock profile-engine``
    (:mod:`time2clock.engine`)."""
    if gpu not in LLM_GPUS:
        return None
    from simulator.generative import engine_prior as sweep

    return sweep(gpu)


def bind_llm(triton: Any, state_path: str) -> bool:
    """Bind ``simllm`` when the simulated GPU has an LLM profile (False when it has none)."""
    from pytriton.model_config import ModelConfig, Tensor

    device = SimulatedDevice.attach(Path(state_path))
    if device.profile.name not in LLM_GPUS:
        device.close()
        return False
    profile = get_llm_profile(device.profile.name)
    llm = EmulatedLlm(device, profile, EngineLimits(kv_capacity_tokens=profile.kv_capacity_tokens))

    async def simllm(requests: list[dict[str, Any]]) -> AsyncIterator[list[dict[str, Any]]]:
        (request,) = requests
        text = request["text_input"].reshape(-1)[0]
        text = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
        output = int(request["max_tokens"].reshape(-1)[0]) if "max_tokens" in request else 16
        prompt = min(prompt_tokens(text), MAX_PROMPT_TOKENS)
        output = min(max(1, output), MAX_OUTPUT_TOKENS)
        async for token in llm.generate(prompt, output):
            word = f"t{token.index} ".encode()
            yield [{"text_output": np.array([word], dtype=object)}]

    triton.bind(
        SIMLLM,
        simllm,
        inputs=[
            Tensor(name="text_input", dtype=bytes, shape=(1,)),
            Tensor(name="max_tokens", dtype=np.int32, shape=(1,), optional=True),
        ],
        outputs=[Tensor(name="text_output", dtype=bytes, shape=(1,))],
        config=ModelConfig(batching=False, decoupled=True),
    )
    return True
