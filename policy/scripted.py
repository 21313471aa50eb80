"""A scripted policy for tests and demonstrations: a plain function decides each action.

It stands in for a model where a test needs exact control of what agents do. Token ids are the
action's bytes; logprobs are zero (the script is deterministic).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from collective.base.seeding import Stream, derive
from policy import tokenizer
from policy.base import PolicyRequest, PolicyResponse

Script = Callable[[PolicyRequest], str]


class ScriptedPolicy:
    tokenizer_name = "bytes"  # its token ids (see collective.replay.tokenizer_of)

    def __init__(self, script: Script, name: str = "scripted") -> None:
        self.script = script
        self.name = name
        self.version = 0
        self.batches: list[int] = []  # the size of every batch it was asked, for tests

    async def generate(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]:
        self.batches.append(len(requests))
        out = []
        for r in requests:
            text = self.script(r)
            ids = [*tokenizer.encode(text), tokenizer.EOS]
            out.append(
                PolicyResponse(
                    text=text,
                    token_ids=ids,
                    logprobs=[0.0] * len(ids),
                    prompt_tokens=tokenizer.count(r.prompt),
                    version=0,
                )
            )
        return out

    async def aclose(self) -> None:
        return None


# -- scripted players of the workshop (worlds/workshop.py with ``terse = True``) ---------------
#
# The controls of bench/findings_controls.py: what a policy that never learns gets, so that a
# finding a script reproduces is known to be built into the world. Each reads only the prompt an
# agent is given (its first line is the world's terse observation, its ``last:`` line the result
# of its last action), as a model would; randomness comes from the request's own seed.

_SLOT = re.compile(r"(\d+)=m(\d+) [\d.]+( k\d+\?)?( busy)?")
_WANT = re.compile(r"k(\d+)@(\d+)")
_KNOW = re.compile(r"k(\d+)")
_LANDED = re.compile(r"^m(\d+)(?::| built)")


class WorkshopScript:
    """One scripted way to play the terse workshop, as a ``Script`` (call it with a request).

    - ``hire``: an agent that may hire does, until its budget says no, before anything else;
    - ``keys``: what a key holder does, unasked, for every other agent (ids from its ``msg``
      domain), and again when its desk says ``want k<j>@<a>``: ``"pass"`` sends a message
      naming its keys, four at most (what a 24-token answer holds; it teaches them),
      ``"mute"`` sends as many messages without a key (as much talk, no knowledge), ``"never"``
      sends nothing;
    - ``avoid``: work only slots it can work (no missing key) that nobody else is at work on
      (no ``busy``), keeping to the module it worked last and otherwise picking at random (a
      stochastic policy's way to break the tie between agents shown the same desk), and first
      (and after a clash) waiting a random 1 to ``jitter`` seconds, so that agents shown the
      same desk at once do not all pick alike; without it, always ``work 1``.
    With nothing it can work, an agent tries a slot whose key it lacks once (the refusal tells
    the holder the key is wanted), then waits for a message, at most ``patience`` seconds.
    """

    def __init__(
        self,
        *,
        hire: bool,
        keys: str,
        avoid: bool,
        patience: int = 10,
        jitter: int = 6,
        name: str = "",
    ) -> None:
        if keys not in ("pass", "mute", "never"):
            raise ValueError(f"WorkshopScript: keys must be pass, mute or never, got {keys!r}")
        self.hire, self.keys, self.avoid, self.patience = hire, keys, avoid, patience
        self.jitter = jitter
        self.name = name or f"workshop-{keys}"
        self.state: dict[int, dict[str, object]] = {}

    def __call__(self, r: PolicyRequest) -> str:
        obs = r.prompt.split("\n", 1)[0]
        last = r.prompt.rsplit("\nlast: ", 1)[-1].removesuffix("\n>")
        st = self.state.setdefault(r.agent, {"told": set(), "asked": set()})
        hire = next((t for t in r.space.tools if t.name == "hire"), None)
        if self.hire and hire is not None and not st.get("hired_all"):
            if st.get("hiring") and last.startswith("error"):
                st["hired_all"] = True
            else:
                st["hiring"] = True
                return f"hire {hire.args[0].choices[0]}"
        landed = _LANDED.match(last)
        if landed:
            st["module"] = int(landed.group(1))
        mine = (
            [int(k) for k in _KNOW.findall(obs.split("know ", 1)[1].split(";", 1)[0])]
            if "know " in obs
            else []
        )
        st.setdefault("holder", bool(mine))  # held keys from the start (not told them)
        if self.keys != "never" and mine:
            told: set[tuple[int, int]] = st["told"]  # type: ignore[assignment]
            msg = next((t for t in r.space.tools if t.name == "msg"), None)
            others = range(1, msg.args[0].hi + 1) if msg is not None and st["holder"] else ()
            # A first holder tells everyone else every key it holds (unasked: a refusal costs a
            # unit's time); anyone tells whoever its desk says still wants one.
            todo = [(k, a) for a in others for k in mine if (k, a) not in told]
            if "want " in obs:
                asks = _WANT.findall(obs.split("want ", 1)[1].split(";", 1)[0])
                todo += [(int(k), int(a)) for k, a in asks if (int(k), int(a)) not in told]
            if todo:
                to = todo[0][1]
                keys = list(dict.fromkeys(k for k, a in todo if a == to))[:4]  # fits 24 tokens
                told.update((k, to) for k in keys)
                text = " ".join(f"k{k}" for k in keys) if self.keys == "pass" else "soon"
                return f'msg {to} "{text}"'
        slots = [
            (int(i), int(m), bool(lack), bool(busy)) for i, m, lack, busy in _SLOT.findall(obs)
        ]
        if not slots:
            return f"wait {self.patience}"
        if not self.avoid:
            return "work 1"
        if last == "you have just started" or "clashed" in last:
            # Agents shown the same desk at the same instant would pick alike: start a random
            # moment later, so that the later see the earlier's work as busy.
            return f"wait {1 + Stream(r.seed).below(self.jitter)}"
        ok = [(i, m) for i, m, lack, busy in slots if not lack and not busy]
        for i, m in ok:
            if m == st.get("module"):
                return f"work {i}"
        if ok:
            i, _ = ok[Stream(r.seed).below(len(ok))]
            return f"work {i}"
        asked: set[int] = st["asked"]  # type: ignore[assignment]
        for i, m, lack, busy in slots:
            if lack and not busy and m not in asked:
                asked.add(m)
                return f"work {i}"
        return f"wait {self.patience}"


class PriorScript(WorkshopScript):
    """The signs-of-life study's starting prior, named before any training (fourth edition):
    the format and the local skills, not the strategy. It works its own desk as the oracle does
    (``avoid``: no clash, keeps to its module, tries a missing key once, waits), and on a share
    ``talk`` of its turns sends a message to a teammate drawn uniformly, of one to three words
    drawn uniformly from the text argument's suggested vocabulary (the world's lexicon, whose
    key names ``k<j>`` are among its words): keys are named only by chance, to whoever the draw
    picks, never to who wants them. It never passes keys on purpose and never hires. Imitated
    by ``collective sft``, it gives the byte model a prior that talks in varied, well-formed
    text, so "does talk become purposeful?" starts from talk the model already makes."""

    TALK_STREAM = 0x7A1C  # folded into a request's seed: talk draws apart from the desk's

    def __init__(self, talk: float = 0.15, budget: int = 23) -> None:
        super().__init__(hire=False, keys="never", avoid=True, name="prior")
        self.talk = talk
        self.budget = budget  # the action's bytes at most (24 output tokens: one for EOS)

    def __call__(self, r: PolicyRequest) -> str:
        rng = Stream(derive(r.seed, self.TALK_STREAM))
        msg = next((t for t in r.space.tools if t.name == "msg"), None)
        if msg is not None and rng.random() < self.talk:
            to_arg, text_arg = msg.args[0], msg.args[1]
            others = [a for a in range(to_arg.lo, to_arg.hi + 1) if a != r.agent]
            if others and text_arg.words:
                to = others[rng.below(len(others))]
                words = [text_arg.words[rng.below(len(text_arg.words))] for _ in range(3)]
                words = words[: 1 + rng.below(3)]
                while words and len(f'msg {to} "{" ".join(words)}"') > self.budget:
                    words.pop()
                if words:
                    return f'msg {to} "{" ".join(words)}"'
        return super().__call__(r)


def workshop_scripts() -> dict[str, Callable[[], WorkshopScript]]:
    """The controls by name, each a fresh (stateful) script per episode batch."""
    return {
        "oracle": lambda: WorkshopScript(hire=True, keys="pass", avoid=True, name="oracle"),
        "hire_everyone": lambda: WorkshopScript(
            hire=True, keys="never", avoid=False, name="hire_everyone"
        ),
        "never_pass_keys": lambda: WorkshopScript(
            hire=True, keys="mute", avoid=True, name="never_pass_keys"
        ),
        "no_communication": lambda: WorkshopScript(
            hire=True, keys="never", avoid=True, name="no_communication"
        ),
    }


# -- a scripted player of the library (worlds/library.py) ---------------------------------------

_LOCK = re.compile(r"(\d+):(open|shut)(\+lib|\+pub)?")


class LibraryScript:
    """Reads the library's observation (``locks 0:shut+lib 1:open ...``): recalls a shut lock
    the library holds, else tries a key in a shut lock (keys tried in turn, from the request's
    own seed), and with ``publish`` puts each lock it sees open (not from the library, not yet
    published) there. Without ``publish`` it is the player who uses the commons and never feeds
    it. It reads only the prompt: one instance may play many episodes at once."""

    def __init__(self, publish: bool = True) -> None:
        self.publish = publish

    def __call__(self, r: PolicyRequest) -> str:
        locks = _LOCK.findall(r.prompt.split("\n", 1)[0])
        for i, state, lib in locks:
            if state == "shut" and lib == "+lib":
                return f"recall {i}"
        if self.publish:
            for i, state, lib in locks:
                if state == "open" and not lib:
                    return f"publish {i}"
        shut = [int(i) for i, state, _ in locks if state == "shut"]
        if not shut:
            return "wait 5"
        lock = shut[r.agent % len(shut)]
        return f"try_key {lock} {1 + int(Stream(r.seed).random() * 6)}"
