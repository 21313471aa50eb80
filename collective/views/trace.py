"""An episode in the Chrome Trace Event format, for Perfetto (ui.perfetto.dev) and chrome://tracing.

``collective trace ep.msgpack --out ep.trace.json``. Trace time is simulated time (one simulated
second is one second of trace time), so a viewer's rulers read as the episode's clock. Layout:

- process "agents": one thread per agent, named ``agent N (role)``. Its life is one slice, from
  when it was spawned (or hired) to when it was fired or the episode ended; inside it, every
  think (asked to answered: the prompt, the answer text, its tokens and its policy batch as
  arguments) and every action (begun to landed: its text and result) as nested slices; rejected
  actions and lost or dropped messages as zero-length marks; a counter per agent of the messages
  waiting in its mailbox.
- process "commons": a thread per channel (posts and reads) and one for the archive (puts and
  searches).
- process "policy": the policy batches, one slice per batch from when it was asked to when its
  last answer landed, on as many lanes as needed so that no two overlap on one. A batch's
  ``policy`` is the policy that ran the episode (``random``, a checkpoint, ...); its
  ``org_policy`` is which of the organisation's two it answered for (``trained``, the one RLCR
  updates, or ``frozen``), a role's, not a claim that the answers came from trained weights.
- process "episode": the anytime score as a counter.
- arrows (flow events): every delivered message from the action that sent it to the think that
  read it (or to the mark where it was lost), every post to its channel, every hire to the new
  agent.

The events are written as they are derived, never held as one list, so a trace of 100,000 agents
streams to disk in constant memory beyond the episode itself. The format's rules that viewers
rely on hold by construction: slices on one thread nest (begin ``B`` and end ``E`` pairs, and
complete ``X`` events only where they cannot overlap), every flow start ``s`` has one flow end
``f`` with the same id, category and name, and each thread's events are in time order.
"""

from __future__ import annotations

from collections.abc import Container, Iterator
from pathlib import Path
from typing import IO, Any

import msgspec

from collective.base.args import parse_int
from collective.records import Episode, EpisodeStream, Spawned
from collective.views.timeline import (
    THINK,
    ArrowIn,
    ArrowOut,
    Board,
    Close,
    Depth,
    Mark,
    Open,
    activity,
    policy_batches,
)

AGENTS, COMMONS, POLICY, EPISODE = 1, 2, 3, 4  # process ids
FLOW_CAT = "flow"
# Past these, viewers struggle: chrome://tracing reads the file as one string (V8 caps strings
# at about 512 MB), and both viewers slow down with thousands of tracks.
WARN_BYTES = 256 * 2**20
WARN_AGENTS = 1_000


class Written(msgspec.Struct):
    """What a trace export wrote."""

    path: str
    events: int
    bytes: int
    agents: int  # agent tracks written
    flows: int  # arrows (pairs of s and f events)
    batches: int


class AgentIds(Container[int]):
    """Agent ids given as ids and ranges, held as given: ``0-100000000000`` is one range, not
    a set of 10**11 ids."""

    def __init__(self, ids: frozenset[int], spans: tuple[range, ...]) -> None:
        self.ids, self.spans = ids, spans

    def __contains__(self, agent: object) -> bool:
        return agent in self.ids or any(agent in span for span in self.spans)


def parse_agents(text: str) -> AgentIds:
    """``0-9,42`` -> the agents 0 to 9 and 42: the agents to keep in a trace."""
    ids: set[int] = set()
    spans: list[range] = []
    if not text:
        raise ValueError(f"--agents: no agent ids given in {text!r}")
    for part in text.split(","):
        lo, dash, hi = part.partition("-")
        try:  # (numbers read as every flag reads them: collective.base.args)
            a, b = parse_int(lo), parse_int(hi) if dash else parse_int(lo)
        except ValueError:
            raise ValueError(
                f"--agents: expected ids and ranges like 0-9,42, got {part!r}"
            ) from None
        if a < 0 or b < a:
            raise ValueError(f"--agents: {part!r} is not a range of agent ids")
        if b - a < 64:
            ids.update(range(a, b + 1))
        else:
            spans.append(range(a, b + 1))
    if not ids and not spans:
        raise ValueError(f"--agents: no agent ids given in {text!r}")
    return AgentIds(frozenset(ids), tuple(spans))


def no_wall_clock(ep: Episode | EpisodeStream) -> str | None:
    """Why ``--real`` cannot be honoured for this episode, or None if it can.

    Only a ``real``-clock episode has wall-clock times: its simulated clock *is* the wall clock
    (answers land when they really came back). A ``virtual`` one holds simulated times only, and
    a ``hybrid`` one simulated times plus the measured real seconds of its tools (those are in
    each tool slice's ``real_seconds`` argument), not a wall-clock timeline."""
    clock = ep.config.clock
    if clock == "real":
        return None
    extra = (
        " plus the measured real seconds of its tools (each tool slice's real_seconds argument)"
        if clock == "hybrid"
        else ""
    )
    return (
        f"--real needs wall-clock times, but this episode ran with clock={clock}: its record "
        f"holds simulated times only{extra}; drop --real (only clock=real episodes have them)"
    )


def _us(t: float) -> float:
    """Simulated seconds to trace microseconds (nanosecond resolution, no float noise)."""
    return round(t * 1e6, 3)


def trace_events(
    ep: Episode | EpisodeStream,
    keep: Container[int] | None = None,
    real: bool = False,
    progress: bool = False,
) -> Iterator[dict[str, Any]]:
    """The episode as trace events, in an order viewers read correctly (see the module doc).

    ``keep``: the agent ids to give tracks (None: all). Arrows to or from an agent not kept are
    left out, and so are its posts, reads, puts and searches; the batches and the score stay
    whole. ``real``: use the recorded wall-clock times (only ``clock = "real"`` episodes have
    them). ``progress``: a progress bar over the episode's events (for long ones)."""
    if real and (why := no_wall_clock(ep)) is not None:
        raise ValueError(why)

    def shown(agent: int | str) -> bool:
        return isinstance(agent, str) or keep is None or agent in keep

    for i, (pid, label) in enumerate(
        [(EPISODE, "episode"), (POLICY, "policy"), (COMMONS, "commons"), (AGENTS, "agents")]
    ):
        yield {"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": label}}
        yield {"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": i}}

    yield from _thread(EPISODE, 1, "score", 0)
    for t, score in ep.curve:
        yield _event("C", EPISODE, 1, t, "score", None, {"score": score})

    batch_of: dict[tuple[int, int], int] = {}
    lanes: list[float] = []  # when each lane's last batch ends
    for i, b in enumerate(policy_batches(ep)):
        for key in b.turns:
            batch_of[key] = i
        lane = next((k for k, end in enumerate(lanes) if end <= b.asked), len(lanes))
        if lane == len(lanes):
            lanes.append(0.0)
            label = "batches" if lane == 0 else f"batches (overlapping, {lane + 1})"
            yield from _thread(POLICY, lane + 1, label, lane)
        lanes[lane] = b.answered
        args: dict[str, Any] = {
            "batch": i,
            "policy": ep.config.policy,
            "org_policy": b.policy,
            "requests": len(b.turns),
            "prompt_tokens": b.prompt_tokens,
            "output_tokens": b.output_tokens,
        }
        batch = _event("X", POLICY, lane + 1, b.asked, f"batch of {len(b.turns)}", "batch", args)
        batch["dur"] = _us(b.answered) - batch["ts"]
        yield batch

    boards: dict[str, int] = {}
    from tqdm import tqdm

    events = tqdm(ep.events, disable=not progress, unit="event", desc="trace", dynamic_ncols=True)
    for item in activity(ep, events):
        if isinstance(item, Open | Close | Mark | Depth) and not shown(item.agent):
            continue
        match item:
            case Open(agent=a, t=t, kind=kind, name=n, args=args):
                if kind == "life":
                    yield from _thread(AGENTS, a + 1, f"agent {a} ({args['role']})", a)
                if kind == THINK:
                    args = {**args, "batch": batch_of.get((a, args["turn"]), -1)}
                yield _event("B", AGENTS, a + 1, t, n, kind, args)
            case Close(agent=a, t=t, kind=kind, name=n, args=args):
                yield _event("E", AGENTS, a + 1, t, n, kind, args)
            case Mark(agent=a, t=t, name=n, args=args):
                yield {**_event("X", AGENTS, a + 1, t, n, "mark", args), "dur": 0}
            case Depth(agent=a, t=t, depth=d):
                yield _event("C", AGENTS, a + 1, t, f"mailbox {a}", None, {"depth": d})
            case Board(track=track, t=t, name=n, args=args):
                if not shown(args["by"]):
                    continue
                tid = boards.get(track)
                if tid is None:
                    tid = boards[track] = len(boards) + 1
                    yield from _thread(COMMONS, tid, track, tid)
                yield {**_event("X", COMMONS, tid, t, n, "board", args), "dur": 0}
            case ArrowOut(id=i, kind=kind, agent=a, t=t, to=to):
                if shown(a) and shown(to):
                    yield {**_event("s", AGENTS, a + 1, t, kind, FLOW_CAT, None), "id": i}
            case ArrowIn(id=i, kind=kind, to=to, t=t, sender=sender):
                if shown(sender) and shown(to):
                    pid, tid = (COMMONS, boards[to]) if isinstance(to, str) else (AGENTS, to + 1)
                    yield {**_event("f", pid, tid, t, kind, FLOW_CAT, None), "id": i, "bp": "e"}


def _event(
    ph: str, pid: int, tid: int, t: float, name: str, cat: str | None, args: dict[str, Any] | None
) -> dict[str, Any]:
    ev: dict[str, Any] = {"ph": ph, "pid": pid, "tid": tid, "ts": _us(t), "name": name}
    if cat is not None:
        ev["cat"] = cat
    if args is not None:
        ev["args"] = args
    return ev


def _thread(pid: int, tid: int, label: str, index: int) -> Iterator[dict[str, Any]]:
    """A thread's name and its place among its process's threads."""
    yield {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": label}}
    yield {
        "ph": "M",
        "pid": pid,
        "tid": tid,
        "name": "thread_sort_index",
        "args": {"sort_index": index},
    }


def agents_in(ep: Episode | EpisodeStream, keep: Container[int] | None = None) -> int:
    """How many agent tracks a trace of this episode has."""
    return sum(1 for e in ep.events if isinstance(e, Spawned) and (keep is None or e.agent in keep))


def write_trace(
    ep: Episode | EpisodeStream,
    out: str | Path | IO[bytes],
    keep: Container[int] | None = None,
    real: bool = False,
    progress: bool = False,
) -> Written:
    """Stream the episode's trace into ``out`` (a path, written atomically, or a binary file)."""
    if real and (why := no_wall_clock(ep)) is not None:
        raise ValueError(why)
    c = ep.config
    header = {
        "displayTimeUnit": "ms",
        "otherData": {
            "world": c.world,
            "agents": c.agents,
            "org": c.org,
            "world_seed": c.world_seed,
            "sample_seed": c.sample_seed,
            "time_limit": c.time_limit,
            "clock": c.clock,
            "time": "wall-clock seconds" if real else "simulated seconds",
            "policy": c.policy,
            "score": ep.score,
            "end": ep.end,
        },
    }
    encode = msgspec.json.Encoder().encode
    counts = Written(
        path=str(out) if isinstance(out, str | Path) else "",
        events=0,
        bytes=0,
        agents=0,
        flows=0,
        batches=0,
    )

    def stream(f: IO[bytes]) -> None:
        head = encode(header)[:-1] + b',"traceEvents":[\n'
        f.write(head)
        size = len(head)
        first = True
        for ev in trace_events(ep, keep, real, progress):
            line = encode(ev) if first else b",\n" + encode(ev)
            first = False
            f.write(line)
            size += len(line)
            counts.events += 1
            ph = ev["ph"]
            if ph == "s":
                counts.flows += 1
            elif ph == "B" and ev["cat"] == "life":
                counts.agents += 1
            elif ph == "X" and ev["cat"] == "batch":
                counts.batches += 1
        f.write(b"\n]}\n")
        counts.bytes = size + 4

    if isinstance(out, str | Path):
        from collective.base.outputs import writing

        with writing(out, "--out", buffering=1 << 20) as f:
            stream(f)
    else:
        stream(out)
    return counts
