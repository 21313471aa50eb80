"""Agent programs for tests (a ``program=`` of ``run_episode`` or ``Conductor``)."""

from __future__ import annotations

import random

import trio

from collective import Actor


async def jittery(actor: Actor) -> None:
    """The default agent loop, yielding to trio's scheduler a random number of times before
    every park, from an unseeded stream: trio runs the actors in a different order every time,
    and an episode must not show it."""
    jitter = random.Random()
    result = "you have just started"
    while True:
        for _ in range(jitter.randrange(4)):
            await trio.lowlevel.checkpoint()
        prompt = actor.prompt(result)
        for _ in range(jitter.randrange(4)):
            await trio.lowlevel.checkpoint()
        response = await actor.think(prompt)
        for _ in range(jitter.randrange(4)):
            await trio.lowlevel.checkpoint()
        result = await actor.act(response.text)
