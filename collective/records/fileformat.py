"""An episode file is a fixed header and then the msgpack-encoded episode (the body). The header
carries the file format, flags that say how the body is stored (0: plain msgpack; a compressed
or chunked body would be another flag, with the same header), the body's length and a BLAKE2b
digest of header and body. Loading checks all four before it decodes anything, and decodes
strictly (a field this version does not know is refused, not skipped), so a changed byte
anywhere is an error, never a silently different episode. The digest is a checksum, not a
signature: it proves a file is the one written, not who wrote it; ``replay`` re-derives
everything derivable from the config and the recorded answers to catch a consistent forgery.

The schema it stores is :mod:`collective.records.schema`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import msgspec
import zstandard

from collective.base.actions import ActionSpace, longest_action
from collective.records.schema import (
    FORMAT,
    AnyEvent,
    Delivered,
    Episode,
    EpisodeConfig,
    Failed,
    Fired,
    Spawned,
    Stats,
    Turn,
    failure_text,
)


def world_error(ep: Episode | EpisodeStream) -> str:
    """One line saying how an episode that ended ``world_error`` failed: which world, at what
    time, which method raised what, and where ("" if it did not end so)."""
    if ep.end != "world_error":
        return ""
    e = None
    for x in ep.events:  # forward: a streamed episode is read from its start
        if isinstance(x, Failed):
            e = x
    if e is None:
        return f"world {ep.config.world!r} failed (the record does not say where)"
    what = failure_text(e.world, e.method, e.agent, e.error, e.where)
    return f"world {ep.config.world!r} failed at t={e.t:.3f}: {what}"


class EpisodeFileError(ValueError):
    """An episode file is missing, truncated, corrupt, changed, incomplete, or of another
    format."""


# -- the file: written part by part as the episode runs -------------------------------------


class TurnEnd(msgspec.Struct, array_like=True, gc=False, forbid_unknown_fields=True):
    """How turn ``index`` (its place among the episode's turns) ended: a file records each turn
    when its answer lands and this when its action does, so neither waits for the other."""

    index: int
    tool: str
    kind: str
    ok: bool
    result: str
    finished: float

    def land_on(self, turn: Turn) -> None:
        """Write this ending onto its turn (the one place a file's turn gets its outcome)."""
        turn.tool, turn.kind, turn.ok, turn.result, turn.finished = (
            self.tool,
            self.kind,
            self.ok,
            self.result,
            self.finished,
        )


class Opening(msgspec.Struct, tag="open", array_like=True, forbid_unknown_fields=True):
    """The first part of an episode file: what reproduces it."""

    config: EpisodeConfig


class Chunk(msgspec.Struct, tag="chunk", array_like=True, forbid_unknown_fields=True):
    """The record as it grew since the last chunk. Turns are as answered (their outcome
    blank: ``tool``, ``kind``, ``ok``, ``result`` empty, ``finished`` -1); the outcomes come as
    ``ends``, in the order (finished, index), wherever the action landed."""

    events: list[AnyEvent]
    turns: list[Turn]
    ends: list[TurnEnd]
    spaces: list[ActionSpace]  # action spaces first used since the last chunk
    curve: list[tuple[float, float]]


class Closing(msgspec.Struct, tag="close", array_like=True, forbid_unknown_fields=True):
    """The last part: how the episode ended. ``turns`` counts the turn records (the stats
    count only answers that landed before the end)."""

    score: float
    duration: float
    end: str
    stats: Stats
    world_metrics: dict[str, float]
    turns: int


Part = Opening | Chunk | Closing

# The file header: magic, format, flags, body length, BLAKE2b-256 digest. Fixed size, so a
# reader checks it before touching the body. Two bodies exist (the flags say which):
#   0 (read, not written): the episode as one msgpack; the digest covers the header's
#     first 20 bytes, then the body.
#   1: parts (an Opening, Chunks, a Closing), each a frame: 4 bytes of big-endian length, then
#     the part's msgpack compressed as one zstd frame. The digest covers the body, then the
#     header's first 20 bytes, so a writer can hash as it streams and seal the header last.
# While a writer is still at work the header's flags say INCOMPLETE: a run killed mid-episode
# leaves a file every reader refuses, never one that loads.
MAGIC = b"\x89CLEPI\r\n"  # not text, not msgpack; \r\n catches a newline-translating copy
_HEADER = struct.Struct(">8sHHQ32s")
HEADER_SIZE = _HEADER.size
_SIGNED = 20  # the header bytes the digest covers (all but the digest itself)
BODY_MSGPACK = 0
BODY_ZSTD_PARTS = 1
INCOMPLETE = 0xFFFF
_FRAME = struct.Struct(">I")
# Level 3: most of zstd's size for little of its time (bench/results/engine/README.md, figures).
ZSTD_LEVEL = 3
CHUNK_RECORDS = 4096  # events or turns a chunk holds before it is written (about 1 MB of msgpack)
MAX_PART = 1 << 30  # the most one part may expand to: a sealed file cannot make us allocate more

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Episode)
_part_decoder = msgspec.msgpack.Decoder(Part)


def encode_episode(ep: Episode) -> bytes:
    """The episode as one msgpack (what golden digests and equality tests compare). The same
    episode always gives the same bytes."""
    return _encoder.encode(ep)


def blank_turn(turn: Turn) -> Turn:
    """A turn as answered: its outcome not yet known."""
    if not (turn.kind or turn.tool or turn.ok or turn.result or turn.finished != -1.0):
        return turn
    return msgspec.structs.replace(turn, tool="", kind="", ok=False, result="", finished=-1.0)


def turn_end(index: int, turn: Turn) -> TurnEnd:
    return TurnEnd(index, turn.tool, turn.kind, turn.ok, turn.result, turn.finished)


def episode_parts(ep: Episode) -> Iterator[Part]:
    """A whole episode as the parts a file holds (a run writing as it goes gives the same
    content; its chunks are cut elsewhere). An outcome goes no earlier than its turn."""
    yield Opening(ep.config)
    ends = sorted(
        (turn_end(i, t) for i, t in enumerate(ep.turns) if t.kind),
        key=lambda e: (e.finished, e.index),
    )
    n = CHUNK_RECORDS
    k = taken = 0
    while k == 0 or k * n < max(len(ep.events), len(ep.turns), len(ep.curve)) or taken < len(ends):
        turns = min(len(ep.turns), (k + 1) * n)  # turns written once this chunk is
        first = taken
        while taken < len(ends) and taken - first < n and ends[taken].index < turns:
            taken += 1
        cut = slice(k * n, (k + 1) * n)
        yield Chunk(
            ep.events[cut],
            [blank_turn(t) for t in ep.turns[cut]],
            ends[first:taken],
            ep.spaces if k == 0 else [],
            ep.curve[cut],
        )
        k += 1
    yield Closing(ep.score, ep.duration, ep.end, ep.stats, ep.world_metrics, len(ep.turns))


class _Sealer:
    """Frames parts and hashes them as they go; ``header`` seals what was framed."""

    def __init__(self) -> None:
        self.hash = hashlib.blake2b(digest_size=32)
        self.length = 0
        self.zstd = zstandard.ZstdCompressor(level=ZSTD_LEVEL)

    def frame(self, part: Any) -> bytes:
        data = self.zstd.compress(_encoder.encode(part))
        frame = _FRAME.pack(len(data)) + data
        self.hash.update(frame)
        self.length += len(frame)
        return frame

    def header(self) -> bytes:
        head = _HEADER.pack(MAGIC, FORMAT, BODY_ZSTD_PARTS, self.length, b"")[:_SIGNED]
        self.hash.update(head)
        return head + self.hash.digest()


def parts_file_bytes(parts: Iterable[Any]) -> bytes:
    """A sealed file of these parts (msgpack-encodable: structs, or plain data in tests)."""
    sealer = _Sealer()
    body = b"".join(sealer.frame(p) for p in parts)
    return sealer.header() + body


def episode_file_bytes(ep: Episode) -> bytes:
    """What an episode file holds: the header, then the episode's parts."""
    return parts_file_bytes(episode_parts(ep))


class EpisodeWriter:
    """Writes an episode file part by part while the episode runs, so a long episode's record
    is on disk, compressed, rather than in memory. It writes beside the target and renames
    over it only when sealed (see :mod:`collective.base.outputs`): until then the old file, if any,
    is untouched, and the one being written says INCOMPLETE in its header."""

    def __init__(self, path: str | Path, label: str = "output") -> None:
        from collective.base.outputs import begin_file

        self.label = label
        self.target, self.tmp, self.file = begin_file(path, label)
        self.file.write(_HEADER.pack(MAGIC, FORMAT, INCOMPLETE, 0, bytes(32)))
        self.sealer = _Sealer()

    def write(self, part: Part) -> None:
        try:
            self.file.write(self.sealer.frame(part))
        except OSError as e:
            self._failed(e)

    def finish(self) -> Path:
        """Seal the header and put the file in place; returns the file written."""
        from collective.base.outputs import finish_file

        try:
            self.file.seek(0)
            self.file.write(self.sealer.header())
            self.file.close()
        except OSError as e:
            self._failed(e)
        return finish_file(self.target, self.tmp, self.label)

    def _failed(self, e: OSError) -> NoReturn:
        """A write failed (a full disk, a size limit): the temporary goes, the old file stays,
        and the error is one line naming the file and the cause."""
        from collective.base.outputs import abandon_file

        raise abandon_file(self.target, self.tmp, self.file, e, self.label) or e

    def discard(self) -> None:
        """Drop an unfinished file (the episode failed)."""
        with contextlib.suppress(OSError):  # a full disk fails the buffered bytes' flush too
            self.file.close()
        self.tmp.unlink(missing_ok=True)


def _check_header(head: bytes, size: int, where: str) -> int:
    """The body's flags, once the header is what this version reads and the size fits."""
    if size == 0:
        raise EpisodeFileError(f"{where}: empty file, not an episode")
    if len(head) < HEADER_SIZE or not head.startswith(MAGIC):
        if head[:1] in (b"\x8b", b"\x8a", b"\xde") and b"format" in head[:16]:
            raise EpisodeFileError(
                f"{where}: an episode file of format 1 (written before episodes carried a "
                f"digest); this version reads format {FORMAT} only"
            )
        what = "truncated header" if MAGIC.startswith(head[: len(MAGIC)]) else "no episode header"
        raise EpisodeFileError(f"{where}: not an episode file ({what})")
    _, fmt, flags, length, _ = _HEADER.unpack_from(head)
    if fmt != FORMAT:
        raise EpisodeFileError(f"{where}: episode format {fmt}, this version reads {FORMAT}")
    if flags == INCOMPLETE:
        raise EpisodeFileError(
            f"{where}: an incomplete episode (the run writing it stopped before the end)"
        )
    if flags not in (BODY_MSGPACK, BODY_ZSTD_PARTS):
        raise EpisodeFileError(f"{where}: episode flags {flags:#x}, not understood by this version")
    body = size - HEADER_SIZE
    if length != body:
        raise EpisodeFileError(
            f"{where}: the header says {length} bytes of episode, the file has {body} "
            f"({'truncated' if body < length else 'bytes added'})"
        )
    return flags


_DIGEST_MISMATCH = "content does not match its digest (changed or corrupt)"


def _decode_whole(body: bytes | memoryview, where: str) -> Episode:
    """A file of the one-body layout, held to what a file of parts is: its turns' bounds
    checked before they are built, then its records in :class:`_Order`."""
    try:
        shape = _legacy_shape.decode(body)
        _check_turns(shape.turns, shape.config.max_output_tokens + 1, where)
        ep = _decoder.decode(body)
    except msgspec.ValidationError as e:
        raise EpisodeFileError(f"{where}: episode does not match format {FORMAT}: {e}") from None
    except msgspec.DecodeError as e:
        raise EpisodeFileError(f"{where}: not a valid episode body: {e}") from None
    except RecursionError:
        raise EpisodeFileError(f"{where}: not a valid episode body: nested too deep") from None
    if ep.format != FORMAT:
        raise EpisodeFileError(f"{where}: episode format {ep.format}, this version reads {FORMAT}")
    order = _Order(where)
    parts = list(episode_parts(ep))
    for part in parts[1:-1]:
        order.chunk(part)  # type: ignore[arg-type]
    order.closing(parts[-1])  # type: ignore[arg-type]
    return ep


class _TurnShape(msgspec.Struct, kw_only=True):
    token_ids: msgspec.Raw = msgspec.Raw(b"\x90")
    logprobs: msgspec.Raw = msgspec.Raw(b"\x90")


class _ChunkShape(msgspec.Struct, tag="chunk", array_like=True):
    events: msgspec.Raw
    turns: list[_TurnShape]


class _OtherShape(msgspec.Struct, tag="open", array_like=True):
    pass


class _ClosingShape(msgspec.Struct, tag="close", array_like=True):
    pass


# A part read only as far as its turns' lists of token ids and logprobs (the rest is skipped,
# not built): checked before the part is decoded, a sealed file with a turn of 10**9 ids is
# refused at that list's header, not after gigabytes.
_shape_decoder = msgspec.msgpack.Decoder(_ChunkShape | _OtherShape | _ClosingShape)


def _items(raw: msgspec.Raw) -> int:
    """How many items an encoded msgpack array says it holds (-1: not an array)."""
    head = memoryview(raw)
    b = head[0]
    if 0x90 <= b <= 0x9F:
        return b & 0x0F
    if b == 0xDC:
        return int.from_bytes(head[1:3], "big")
    if b == 0xDD:
        return int.from_bytes(head[1:5], "big")
    return -1


def _check_bounds(data: bytes, tokens: int, where: str) -> None:
    """A turn holds at most ``tokens`` token ids and logprobs: the engine keeps at most one
    token past ``max_output_tokens`` of any answer (``conductor.bounded``)."""
    shape = _shape_decoder.decode(data)
    if isinstance(shape, _ChunkShape):
        _check_turns(shape.turns, tokens, where)


def _check_turns(turns: list[_TurnShape], tokens: int, where: str) -> None:
    for t in turns:
        if _items(t.token_ids) > tokens or _items(t.logprobs) > tokens:
            raise EpisodeFileError(
                f"{where}: not a valid episode body: a turn of more than {tokens} tokens "
                "(its max_output_tokens + 1)"
            )


class _LegacyShape(msgspec.Struct):
    config: EpisodeConfig
    turns: list[_TurnShape] = []


_legacy_shape = msgspec.msgpack.Decoder(_LegacyShape)


def _decode_part(frame: bytes | memoryview, where: str, bounds: int | None = None) -> Part:
    """One part, decompressed (at most ``MAX_PART`` bytes) and decoded; with ``bounds`` (the
    episode's most tokens a turn), its turns checked against it before they are built."""
    try:
        size = zstandard.frame_content_size(frame)
        if not 0 <= size <= MAX_PART:
            raise EpisodeFileError(f"{where}: a part of {size} bytes (at most {MAX_PART})")
        data = zstandard.ZstdDecompressor().decompress(frame)
        if bounds is not None:
            _check_bounds(data, bounds, where)
        return _part_decoder.decode(data)
    except msgspec.ValidationError as e:
        raise EpisodeFileError(f"{where}: episode does not match format {FORMAT}: {e}") from None
    except (msgspec.DecodeError, zstandard.ZstdError) as e:
        raise EpisodeFileError(f"{where}: not a valid episode body: {e}") from None
    except RecursionError:
        raise EpisodeFileError(f"{where}: not a valid episode body: nested too deep") from None


class _Order:
    """The rules a file's records keep, checked part by part by every reader (the whole
    loader and the streaming one alike): an agent exists before anything concerns it (ids are
    given in order, each by its ``spawn`` event), a turn comes as answered (its outcome
    blank), an outcome comes after its turn and at most once, and in the end the counts are
    the closing's. What it holds is a byte per turn and a count of agents."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.agents = 0
        self.events = 0
        self.ended = bytearray()  # per turn: 1 once its outcome came
        self.longest: list[int] = []  # per action space: its longest action, in characters
        self.turn_agent = -1  # the highest agent id of a turn

    def fail(self, why: str) -> NoReturn:
        raise EpisodeFileError(f"{self.where}: not a valid episode body: {why}")

    def chunk(self, part: Chunk) -> None:
        n = self.agents
        for e in part.events:
            a = e.agent
            if a >= n:
                if a == n and type(e) is Spawned:
                    n += 1
                    self.events += 1
                    continue
                self.fail(f"event {self.events} concerns agent {a}, of {n} spawned")
            if a < -1:
                self.fail(f"event {self.events} concerns agent {a}")
            if type(e) is Delivered or type(e) is Fired:
                to = e.to if isinstance(e, Delivered) else e.target
                if not 0 <= to < n:
                    self.fail(f"event {self.events} names agent {to}, of {n} spawned")
            self.events += 1
        self.agents = n
        self.longest += [longest_action(space) for space in part.spaces]
        for t in part.turns:
            if t.agent > self.turn_agent:  # a turn may be written before its agent's events
                self.turn_agent = t.agent
            if t.agent < 0:
                self.fail(f"turn {len(self.ended)} is agent {t.agent}'s")
            if not 0 <= t.space < len(self.longest):
                self.fail(f"turn {len(self.ended)} names action space {t.space}")
            if len(t.text) > self.longest[t.space] + 1:  # what the engine keeps at most
                self.fail(f"turn {len(self.ended)}'s text is longer than any action")
            if blank_turn(t) is not t:
                self.fail(f"turn {len(self.ended)} carries its outcome before it ended")
            self.ended.append(0)
        for end in part.ends:
            if not 0 <= end.index < len(self.ended) or not end.kind:
                self.fail(f"an end of turn {end.index}, of {len(self.ended)} turns so far")
            if self.ended[end.index]:
                self.fail(f"turn {end.index} ends twice")
            self.ended[end.index] = 1

    def closing(self, c: Closing) -> None:
        if self.turn_agent >= self.agents:
            self.fail(f"a turn of agent {self.turn_agent}, of {self.agents} spawned")
        if c.turns != len(self.ended) or c.stats.events != self.events:
            self.fail(
                f"the closing counts {c.stats.events} events and {c.turns} turns, the record "
                f"holds {self.events} and {len(self.ended)}"
            )


class _Assembler:
    """Parts in, one checked Episode out: the Opening first, then Chunks, the Closing last; the
    records in the order :class:`_Order` checks."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.order = _Order(where)
        self.config: EpisodeConfig | None = None
        self.bounds: int | None = None
        self.closing: Closing | None = None
        self.events: list[Any] = []
        self.turns: list[Turn] = []
        self.spaces: list[ActionSpace] = []
        self.curve: list[tuple[float, float]] = []

    def add(self, part: Part) -> None:
        bad = ""
        if self.closing is not None:
            bad = "parts after its end"
        elif isinstance(part, Opening):
            bad = "a second opening" if self.config is not None else ""
            self.config = part.config
            self.bounds = part.config.max_output_tokens + 1
        elif self.config is None:
            bad = "no opening"
        elif isinstance(part, Closing):
            self.order.closing(part)
            self.closing = part
        else:
            self.order.chunk(part)
            self.events += part.events
            self.spaces += part.spaces
            self.curve += part.curve
            self.turns += part.turns
            for e in part.ends:
                e.land_on(self.turns[e.index])
        if bad:
            raise EpisodeFileError(f"{self.where}: not a valid episode body: {bad}")

    def episode(self) -> Episode:
        c = self.closing
        if self.config is None or c is None:
            raise EpisodeFileError(f"{self.where}: not a valid episode body: no closing")
        return Episode(
            config=self.config,
            score=c.score,
            duration=c.duration,
            end=c.end,
            stats=c.stats,
            curve=self.curve,
            events=self.events,
            turns=self.turns,
            spaces=self.spaces,
            world_metrics=c.world_metrics,
        )


def _frames(body: bytes | memoryview, where: str) -> Iterator[memoryview]:
    view = memoryview(body)
    at = 0
    while at < len(view):
        if at + _FRAME.size > len(view):
            raise EpisodeFileError(f"{where}: not a valid episode body: a cut frame")
        (n,) = _FRAME.unpack_from(view, at)
        at += _FRAME.size
        if at + n > len(view):
            raise EpisodeFileError(f"{where}: not a valid episode body: a cut frame")
        yield view[at : at + n]
        at += n


def decode_episode(data: bytes, where: str = "episode") -> Episode:
    """Verify and decode an episode file's bytes; EpisodeFileError naming ``where`` if any byte
    is not as written."""
    flags = _check_header(data[:HEADER_SIZE], len(data), where)
    head, digest = data[:_SIGNED], data[_SIGNED:HEADER_SIZE]
    body = memoryview(data)[HEADER_SIZE:]
    if flags == BODY_MSGPACK:
        h = hashlib.blake2b(head, digest_size=32)
        h.update(body)
    else:
        h = hashlib.blake2b(body, digest_size=32)
        h.update(head)
    if h.digest() != digest:
        raise EpisodeFileError(f"{where}: {_DIGEST_MISMATCH}")
    if flags == BODY_MSGPACK:
        return _decode_whole(body, where)
    whole = _Assembler(where)
    for frame in _frames(body, where):
        whole.add(_decode_part(frame, where, whole.bounds))
    return whole.episode()


def save_episode(ep: Episode, path: str | Path, label: str = "output") -> None:
    """Write atomically, and only over a regular file (see :mod:`collective.base.outputs`): a crash
    never leaves a half-written episode under the final name."""
    writer = EpisodeWriter(path, label)
    try:
        for part in episode_parts(ep):
            writer.write(part)
    except BaseException:
        writer.discard()
        raise
    writer.finish()


def sealed_digest(path: str | Path) -> str:
    """The digest an episode file is sealed with (its header's, hex), read without the body:
    what a record that names the file (a training run's ledger) binds it by. Loading the file
    checks its body against it."""
    from collective.base.outputs import open_input

    with open_input(path, "episode") as f:
        head = f.read(HEADER_SIZE)
    return head[_SIGNED:HEADER_SIZE].hex()


def load_episode(path: str | Path) -> Episode:
    """The whole episode in memory (the learner's way: it needs every turn). A long episode is
    better read part by part: :func:`open_episode`."""
    stream = open_episode(path)
    if stream.legacy is not None:
        return stream.legacy
    whole = _Assembler(str(path))
    for part in stream.parts(whole=True):
        whole.add(part)
    return whole.episode()


_BLOCK = 1 << 20


class _Pass:
    """One kind of record of a streamed episode, read anew from the file at each pass."""

    def __init__(self, stream: EpisodeStream, kind: str) -> None:
        self.stream, self.kind = stream, kind

    def __iter__(self) -> Iterator[Any]:
        for chunk in self.stream.chunks():
            yield from getattr(chunk, self.kind)


class _Records(_Pass):
    """... whose number the closing says."""

    def __init__(self, stream: EpisodeStream, kind: str, count: int) -> None:
        super().__init__(stream, kind)
        self.count = count

    def __len__(self) -> int:
        return self.count


class EpisodeStream:
    """An episode file, verified whole when opened (header, length, digest: one pass in blocks
    of a MiB), then read part by part: memory holds a chunk at a time, whatever the episode's
    length. It reads like an :class:`Episode`: ``config``, ``score``, ``duration``, ``end``,
    ``stats``, ``world_metrics`` at once; ``events`` and ``turns`` are passes over the file
    (``len`` is free); ``curve`` and ``spaces`` are read into lists when first asked. Its turns
    are as answered (outcome blank): the outcomes are ``ends``. A file of the earlier one-body
    layout is read whole (``legacy``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.where = where = str(path)
        self.legacy: Episode | None = None
        with self._open() as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(HEADER_SIZE)
            flags = _check_header(head, size, where)
            if flags == BODY_MSGPACK:
                self.legacy = decode_episode(head + f.read(), where)
                self._adopt(self.legacy)
                return
            h = hashlib.blake2b(digest_size=32)
            while block := f.read(_BLOCK):
                h.update(block)
            h.update(head[:_SIGNED])
            if h.digest() != head[_SIGNED:HEADER_SIZE]:
                raise EpisodeFileError(f"{where}: {_DIGEST_MISMATCH}")
            # Where the frames start: the first is the opening, the last the closing.
            self.offsets: list[int] = []
            at = HEADER_SIZE
            while at < size:
                f.seek(at)
                raw = f.read(_FRAME.size)
                if len(raw) < _FRAME.size or at + _FRAME.size + _FRAME.unpack(raw)[0] > size:
                    raise EpisodeFileError(f"{where}: not a valid episode body: a cut frame")
                self.offsets.append(at)
                at += _FRAME.size + _FRAME.unpack(raw)[0]
            if len(self.offsets) < 2:
                raise EpisodeFileError(f"{where}: not a valid episode body: no closing")
            self.bounds: int | None = None
            opening = self._part(f, self.offsets[0])
            if not isinstance(opening, Opening):
                raise EpisodeFileError(f"{where}: not a valid episode body: no opening")
            self.bounds = opening.config.max_output_tokens + 1
            closing = self._part(f, self.offsets[-1])
        if not isinstance(closing, Closing):
            raise EpisodeFileError(f"{where}: not a valid episode body: no closing")
        self.format = FORMAT
        self.config = opening.config
        self.score, self.duration, self.end = closing.score, closing.duration, closing.end
        self.stats, self.world_metrics = closing.stats, closing.world_metrics
        self.events: Any = _Records(self, "events", closing.stats.events)
        self.turns: Any = _Records(self, "turns", closing.turns)
        self.ends: Any = _Pass(self, "ends")
        self._curve: list[tuple[float, float]] | None = None
        self._spaces: list[ActionSpace] | None = None

    def _adopt(self, ep: Episode) -> None:
        self.format, self.config, self.score = ep.format, ep.config, ep.score
        self.duration, self.end, self.stats = ep.duration, ep.end, ep.stats
        self.world_metrics, self.events, self.turns = ep.world_metrics, ep.events, ep.turns
        self._curve, self._spaces = ep.curve, ep.spaces
        ends = sorted(
            (turn_end(i, t) for i, t in enumerate(ep.turns) if t.kind),
            key=lambda e: (e.finished, e.index),
        )
        self.ends = ends
        self.turns = [blank_turn(t) for t in ep.turns]

    def _open(self) -> Any:
        """The file, open for reading: a FIFO or a device is refused before it is read."""
        from collective.base.outputs import InputError, open_input

        try:
            return open_input(self.path, "episode")
        except InputError as e:
            raise EpisodeFileError(str(e)) from None
        except OSError as e:
            raise EpisodeFileError(
                f"{self.where}: cannot read episode file ({e.strerror})"
            ) from None

    def _part(self, f: Any, at: int) -> Part:
        f.seek(at)
        (n,) = _FRAME.unpack(f.read(_FRAME.size))
        return _decode_part(f.read(n), self.where, self.bounds)

    def parts(self, whole: bool = False) -> Iterator[Part]:
        """The file's parts in order (with ``whole``, its opening and closing too), each
        checked as the whole loader checks it (:class:`_Order`) before it is handed on: a pass
        that would reach a record the loader refuses stops there, with the loader's error."""
        if self.legacy is not None:
            yield from episode_parts(self.legacy) if whole else []
            return
        order = _Order(self.where)
        with self._open() as f:
            last = len(self.offsets) - 1
            for i, at in enumerate(self.offsets):
                part = self._part(f, at)
                if (i == 0) != isinstance(part, Opening) or (i == last) != isinstance(
                    part, Closing
                ):
                    raise EpisodeFileError(
                        f"{self.where}: not a valid episode body: parts out of order"
                    )
                if isinstance(part, Chunk):
                    order.chunk(part)
                elif isinstance(part, Closing):
                    order.closing(part)
                if whole or isinstance(part, Chunk):
                    yield part

    def chunks(self) -> Iterator[Chunk]:
        if self.legacy is not None:
            yield from (p for p in episode_parts(self.legacy) if isinstance(p, Chunk))
            return
        yield from self.parts()  # type: ignore[misc]

    def turns_of(self, agent: int | None) -> list[Turn]:
        """Every turn of ``agent`` (None: everyone's) with its outcome, in the record's order."""
        if self.legacy is not None:
            return [t for t in self.legacy.turns if agent is None or t.agent == agent]
        kept: dict[int, Turn] = {}
        i = 0
        for chunk in self.chunks():
            for t in chunk.turns:
                if agent is None or t.agent == agent:
                    kept[i] = t
                i += 1
            for e in chunk.ends:
                turn = kept.get(e.index)
                if turn is not None:
                    e.land_on(turn)
        return list(kept.values())

    @property
    def curve(self) -> list[tuple[float, float]]:
        if self._curve is None:
            self._curve = [point for c in self.chunks() for point in c.curve]
        return self._curve

    @property
    def spaces(self) -> list[ActionSpace]:
        if self._spaces is None:
            self._spaces = [space for c in self.chunks() for space in c.spaces]
        return self._spaces


def open_episode(path: str | Path) -> EpisodeStream:
    """Verify an episode file and read it part by part (see :class:`EpisodeStream`)."""
    return EpisodeStream(path)


class TurnFinder:
    """Turns by (agent, turn), read from ``turns`` only as far as needed: a record keeps each
    turn where its answer landed, soon after it was asked, so a reader that asks for turns in
    the order they were asked holds about the turns in flight, not the episode."""

    def __init__(self, turns: Iterable[Turn]) -> None:
        self.source = iter(turns)
        self.ahead: dict[tuple[int, int], Turn] = {}

    def pop(self, key: tuple[int, int]) -> Turn | None:
        """The turn ``key`` (None if the record has none), forgotten once returned."""
        turn = self.ahead.pop(key, None)
        while turn is None:
            t = next(self.source, None)
            if t is None:
                return None
            if (t.agent, t.turn) == key:
                return t
            self.ahead[(t.agent, t.turn)] = t
        return turn
