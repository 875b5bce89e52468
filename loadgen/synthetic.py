"""Synthetic prompts for a generative run, as aiperf and genai-perf make them: each request's
input and output lengths drawn from normal distributions (mean, standard deviation; rounded,
at least one token), the prompt a text of that many tokens.

There is no tokenizer here (a benchmark machine may not reach a model hub): a token is a word.
The embedded ``simllm`` counts its prompt tokens the same way, so the lengths asked are the
lengths served; on a real engine the input length the report gives is the prompt's word count.
The same seed gives the same requests in the same order, whatever the load does with them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Short, common words: a prompt reads as text, and every word is one token in most vocabularies.
_COMMON = (
    "the of and to in is that it for on was with as be at by this had not are but from or have "
    "an they which one you were her all she there would their we him been has when who will more "
    "no if out so said what up its about into than them can only other new some could time these "
    "two may then do first any my now such like our over man me even most made after also did"
)
WORDS = tuple(_COMMON.split())


@dataclass(frozen=True)
class LengthSpec:
    """A normal distribution of token counts (``stddev`` 0: every request gets ``mean``)."""

    mean: int
    stddev: float = 0.0

    def __post_init__(self) -> None:
        if self.mean < 1:
            raise ValueError(f"a mean length must be >= 1 token, got {self.mean}")
        if self.stddev < 0:
            raise ValueError(f"a length's standard deviation must be >= 0, got {self.stddev}")

    def draw(self, rng: np.random.Generator) -> int:
        if self.stddev == 0:
            return self.mean
        return max(1, round(float(rng.normal(self.mean, self.stddev))))


@dataclass(frozen=True)
class GenRequest:
    """One request of a generative run: its prompt and the output length it asks for (None:
    the server's default)."""

    prompt: str
    input_tokens: int
    output_tokens: int | None


def prompt_of(tokens: int, rng: np.random.Generator) -> str:
    """A prompt of ``tokens`` words drawn from :data:`WORDS`."""
    picks = rng.integers(0, len(WORDS), size=tokens)
    return " ".join(WORDS[i] for i in picks)


class RequestSource:
    """Requests in a seeded order: the ``n``-th is the same in every run with the same seed."""

    def __init__(
        self,
        input_tokens: LengthSpec,
        output_tokens: LengthSpec | None,
        *,
        seed: int = 0,
    ) -> None:
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self._rng = np.random.default_rng(seed)
        self.drawn = 0

    def next(self) -> GenRequest:
        isl = self.input_tokens.draw(self._rng)
        osl = self.output_tokens.draw(self._rng) if self.output_tokens is not None else None
        self.drawn += 1
        return GenRequest(prompt_of(isl, self._rng), isl, osl)

    def take(self, n: int) -> list[GenRequest]:
        return [self.next() for _ in range(n)]
