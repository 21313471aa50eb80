"""How long a policy call takes in simulated time.

Simulated latency comes from token counts and the speeds of the deployment being simulated,
never from how long the batch really ran on this machine (except in ``real`` clock mode), so an
episode's timeline does not depend on the machine that computed it. The preset in use is
recorded in every episode.
"""

from __future__ import annotations

import math

import msgspec


class LatencyModel(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``overhead + prompt_tokens / prefill_tps + output_tokens / decode_tps`` seconds, then
    rounded up to the deployment's scheduler ``tick``.

    The tick models a serving engine that admits and returns work in scheduling steps: answers
    that would land within one tick of each other land together, so agents that were in step
    stay in step and their next calls batch together, as they would on a real server. 0 turns
    it off (every call lands at its own instant).
    """

    name: str = "custom"
    prefill_tps: float = 10_000.0  # prompt tokens per second, per request
    decode_tps: float = 50.0  # output tokens per second, per request
    overhead: float = 0.5  # seconds per call (queueing, network, scheduling)
    tick: float = 0.0  # answers land on multiples of this many seconds (0: no rounding)

    def __post_init__(self) -> None:
        if self.prefill_tps <= 0 or self.decode_tps <= 0:
            raise ValueError(f"latency model {self.name!r}: token speeds must be > 0")
        if self.overhead <= 0:
            # A zero-cost call would let an agent loop forever at one simulated instant.
            raise ValueError(f"latency model {self.name!r}: overhead must be > 0 seconds")
        if self.tick < 0:
            raise ValueError(f"latency model {self.name!r}: tick must be >= 0 seconds")

    def seconds(self, prompt_tokens: int, output_tokens: int) -> float:
        return self.overhead + prompt_tokens / self.prefill_tps + output_tokens / self.decode_tps

    def answer_at(self, now: float, prompt_tokens: int, output_tokens: int) -> float:
        """When a call made at ``now`` is answered: after its latency, on the next tick."""
        # seconds(), written out: this runs for every answer.
        at = now + (
            self.overhead + prompt_tokens / self.prefill_tps + output_tokens / self.decode_tps
        )
        if self.tick:
            at = math.ceil(at / self.tick) * self.tick
        return at


#: Named deployments. The figures are round numbers of the right order for each setting, not
#: measurements; pass a custom LatencyModel to simulate a measured deployment.
PRESETS: dict[str, LatencyModel] = {
    # An 8B model on one H200 with SGLang, moderate load.
    "h200-8b": LatencyModel(
        name="h200-8b", prefill_tps=20_000.0, decode_tps=80.0, overhead=0.3, tick=0.25
    ),
    # A 70B model on A100s, tensor parallel, moderate load.
    "a100-70b": LatencyModel(
        name="a100-70b", prefill_tps=4_000.0, decode_tps=25.0, overhead=0.8, tick=0.25
    ),
    # A hosted frontier API: large fixed overhead.
    "api": LatencyModel(name="api", prefill_tps=10_000.0, decode_tps=60.0, overhead=2.0, tick=0.5),
    # The project's tiny byte-level model, where one token is one byte.
    "tiny": LatencyModel(
        name="tiny", prefill_tps=50_000.0, decode_tps=200.0, overhead=0.5, tick=0.5
    ),
    # The tiny model priced like a small served model, where output tokens cost time: 50 ms
    # each, so a 24-token message takes about twice a short "work 1" (1.7 s against 0.85,
    # before the tick), and a solo agent given a team's tokens needs time to spend them.
    "tiny-paced": LatencyModel(
        name="tiny-paced", prefill_tps=50_000.0, decode_tps=20.0, overhead=0.5, tick=0.5
    ),
}

DEFAULT_PRESET = "h200-8b"


def latency_preset(name: str) -> LatencyModel:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(
            f"unknown latency preset {name!r}; presets are: {', '.join(PRESETS)}"
        ) from None
