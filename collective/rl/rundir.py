"""The run directory: what a training run writes, and how a stopped run picks up again.

::

    RUN/config.toml         the config as used (every field): the run is reproducible from it
    RUN/config.json         the config as the run began, and its digest: a resume checks
                            config.toml against it (only ``--set steps=N`` may change, logged
                            in RUN/resumes.jsonl)
    RUN/lock                flock-ed by the one process training here (it holds that pid)
    RUN/metrics.jsonl       one StepMetrics line per finished step
    RUN/ledger.jsonl        one Ledger line per finished step: the episode files it used or dropped
    RUN/checkpoints/        the backend's latest (and step-N snapshots), train-state.pt for resume
    RUN/episodes/           every finished episode, g{group}-r{member}.msgpack, replayable
    RUN/plots/

Invariants a resume relies on: an episode file is written (atomically) before anyone uses it;
a step's metrics line, ledger line and checkpoint are written together or not at all (Ctrl-C
waits for them); a resume keeps the lines of the steps before the checkpoint's and the episode
files of the groups after it, so it continues exactly where the uninterrupted run would be.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

import msgspec
import torch
import trio

from collective.base.outputs import InputError, check_input, open_input, save_torch
from collective.records import Episode, load_episode, save_episode, sealed_digest
from collective.rl.commons import Entry
from collective.rl.config import (
    TrainConfig,
    changed_fields,
    config_changes,
    config_digest,
    config_fields,
    dump_config,
    load_config,
    mix,
)

TEAM_BUCKETS = ("solo", "2", "3", "4", "5-8", "9+")
LOCK = "lock"  # RUN/lock: held (flock) by the process training in RUN
PROBE = ".collective-probe-"  # collective.base.outputs' write probe: a racing start's, for a moment


def _ours(name: str) -> bool:
    """Whether an entry of a new run's folder is only what starting a run puts there."""
    return name == LOCK or name.startswith(PROBE)


def bucket(team: int) -> str:
    if team == 1:
        return "solo"
    if team <= 4:
        return str(team)
    return "5-8" if team <= 8 else "9+"


class StepMetrics(msgspec.Struct, kw_only=True):
    """One line of metrics.jsonl: the signs of life of one training step."""

    #: The fields the wall clock decides (how long things took, how requests happened to share
    #: a batch): a rerun of a config matches its run in every other field.
    WALL_CLOCK: ClassVar[frozenset[str]] = frozenset(
        {"wall_time", "learner_seconds", "learner_tokens_per_s", "rollout_batch_mean"}
    )

    step: int
    version: int  # the learner's version after this step
    time_limit: float
    episodes: int
    return_mean: float
    return_min: float
    return_max: float
    score_mean: float
    duration_mean: float  # simulated seconds per episode
    output_tokens: int
    # Attempts, as the episode's Stats count them when an action begins: world tool calls the
    # world then refused included, and every primitive (hire, read, ...) as communication. Kept
    # so every run's lines read alike; the signs of life are the landed_* and talk_* below.
    useful_tokens_mean: float  # output tokens of turns that began a world tool call, per rollout
    useful_average: float  # this step's average of that, over all its rollouts (every team size)
    useful_rel: dict[str, float]  # by team size: those tokens per rollout / this step's average
    comm_tokens_per_hour: float  # tokens of every primitive begun, per simulated hour
    staleness_mean: float
    staleness_max: int
    dropped_stale: int
    downweighted: int
    loss: float
    clip_fraction: float
    ratio_mean: float
    entropy: float
    kl: float
    grad_norm: float
    trained_tokens: float
    # Signal: the groups trained on whose returns differ (the rest have every advantage 0);
    # whether the optimiser stepped (no step, and no momentum update, without any advantage);
    # dynamic sampling (resample > 0): reserve groups played, as many as the groups dropped for
    # want of signal (a primary replaced, or a reserve without signal itself). Defaults: lines
    # written before these fields existed.
    signal_groups: int = -1
    optimiser_step: bool = True
    resampled_groups: int = 0
    # Wall-clock figures: the only fields a re-run with the same config does not reproduce (how
    # many rollouts share a policy batch depends on when the learner frees the CPU).
    learner_tokens_per_s: float
    learner_seconds: float
    rollout_batch_mean: float
    wall_time: float  # seconds since the run (or its resumption) began
    # The signs of life as named (collective/records/signs.py): useful work is the world tool calls
    # that
    # landed, communication the messages and posts that did. By team size (TEAM_BUCKETS), each
    # relative to this step's average rollout (every team size alike). Empty or 0 in the lines
    # of runs written before they existed (readers fall back to the attempts above).
    landed_tokens_mean: float = 0.0  # output tokens of world calls that landed, per rollout
    landed_units_mean: float = 0.0  # world calls that landed, per rollout
    refused_share: float = 0.0  # of world calls' tokens that ended (landed or not): refused
    landed_rel: dict[str, float] = {}  # landed tokens per rollout / this step's average
    landed_per_agent: dict[str, float] = {}  # landed tokens per agent that took part
    talk_tokens_mean: float = 0.0  # message and post tokens per rollout
    talk_per_agent_second: float = 0.0  # message and post tokens / the agents' seconds alive
    talk_rel: dict[str, float] = {}  # talk tokens per rollout / this step's average
    talk_per_agent_second_by_team: dict[str, float] = {}
    # advantage = "turn": the fork rollouts this step ran for its turns' credit (collective/rl/
    # forks.py), the extra episodes to count against the step's own when schemes are compared
    fork_rollouts: int = 0
    # A mix of worlds ([[worlds]]): every metric above per world, by its label (each also with
    # random_score, untrained_score, normalised_score and normalised_gain: collective/rl/
    # baselines.py), and the normalised score and gain over the worlds this step drew
    worlds: dict[str, dict[str, Any]] = {}
    normalised_score: float | None = None
    normalised_gain: float | None = None
    # role_policies: each role's learner figures (loss, entropy, trained_tokens, ...), by role;
    # the fields above are over every role (token-weighted means, collective/rl/roles.py)
    roles: dict[str, dict[str, float]] = {}
    # commons = "on"/"credit" (collective/rl/commons.py): entries the step's episodes started
    # with, entries its episodes added, the world's commons_used per episode, the mean credited
    # value of the entries measured (credit), and the re-runs that measured them
    commons_size: int = 0
    commons_added: int = 0
    commons_used: float = 0.0
    commons_credit: float | None = None
    commons_credited_turns: int = 0  # the maker turns paid (credit samples)
    commons_rollouts: int = 0


class Ledger(msgspec.Struct):
    """Which episode files a step consumed: every finished episode is used once, or dropped
    as stale, or (dynamic sampling) dropped with its group for want of signal, and this file
    says which."""

    step: int
    used: list[str]
    dropped: list[str]
    flat: list[str] = []  # resample: episodes of groups whose returns were all equal
    # Each file's sealed digest (``records.sealed_digest``), by name: what binds the file to the
    # episode the step learned from (a swapped or planted file has another). Empty in the lines
    # of runs written before it existed.
    digests: dict[str, str] = {}

    @classmethod
    def of_step(
        cls,
        step: int,
        groups: Sequence[int],
        size: int,
        used: Sequence[bool],
        flat: Sequence[int] = (),
    ) -> Ledger:
        """``step``'s ledger, from whether each episode of ``groups`` (group indices) x ``size``
        (in group and member order) was used, and the groups dropped for want of signal."""
        names = [episode_name(g, i) for g in groups for i in range(size)]
        return cls(
            step,
            [n for n, u in zip(names, used, strict=True) if u],
            [n for n, u in zip(names, used, strict=True) if not u],
            [episode_name(g, i) for g in flat for i in range(size)],
        )


#: The step-by-step records of a run: one line a finished step each.
RECORDS: tuple[tuple[str, type[StepMetrics] | type[Ledger]], ...] = (
    ("metrics.jsonl", StepMetrics),
    ("ledger.jsonl", Ledger),
)


class TrainState(msgspec.Struct):
    """What resuming needs besides the weights: where the run is."""

    step: int  # the next step to run
    useful_sum: float  # unused since useful work is relative to each step's own average;
    useful_n: int  # kept so that run directories written before still resume
    elapsed: float  # wall seconds spent before this (re)start
    # commons = "on"/"credit": the run's commons (collective/rl/commons.py), as after this step
    commons: list[Entry] = []


def snapshot_name(step: int) -> str:
    """The name (without ``.pt``) of the checkpoint a run keeps of its weights after ``step``
    steps (every ``snapshot_every`` steps, and the last): ``step-NNNNNN``."""
    return f"step-{step:06d}"


def snapshot_step(name: str) -> int | None:
    """The step a :func:`snapshot_name` (``.pt`` or not) names; None for any other name."""
    m = re.fullmatch(r"step-(\d{6,})(?:\.pt)?", name)
    return int(m[1]) if m else None


def episode_name(group: int, member: int) -> str:
    return f"g{group:06d}-r{member:02d}.msgpack"


def episode_key(name: str) -> tuple[int, int] | None:
    """``(group, member)`` of a file named by :func:`episode_name`; None for any other name."""
    m = re.fullmatch(r"g(\d+)-r(\d+)\.msgpack", name)
    return (int(m[1]), int(m[2])) if m else None


def read_metrics(run_dir: str | Path) -> list[StepMetrics]:
    path = Path(run_dir) / "metrics.jsonl"
    data = read_run_file(path)
    if data is None:
        raise ValueError(f"{run_dir}: no metrics.jsonl (is it a run directory?)")
    return [m for _, m in _records(path, data, StepMetrics, torn_last=False)]


#: The files of a run directory a resume reads or appends to, beside ``checkpoints/`` and
#: ``episodes/``: each must be a regular file (or absent), checked before anything is opened.
RUN_FILES = (
    "config.toml",
    "config.json",
    "metrics.jsonl",
    "ledger.jsonl",
    "resumes.jsonl",
    "baselines.json",
    "wandb-run-id",
    "config.digest",
    LOCK,
)


def read_run_file(path: Path) -> bytes | None:
    """A run directory's own file, read as any input is (``outputs.open_input``: opened without
    waiting, refused unless a regular file), so a FIFO or a device planted in a run directory
    is one line, never a hang; None if it is absent. Every reader of a run's records uses it."""
    try:
        with open_input(path, "run directory") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except InputError:
        raise
    except OSError as e:
        raise ValueError(f"{path}: cannot read it ({e.strerror})") from None


def _records(path: Path, data: bytes, kind: type[Any], torn_last: bool) -> list[tuple[int, Any]]:
    """``(line number, record)`` of each line of a JSON-lines file. A line that is not a whole
    record is refused, naming the file and the line, except a last line without its newline
    when ``torn_last`` (what a kill while the line was written leaves: the caller decides)."""
    lines = data.split(b"\n")
    last = len(lines)
    if lines[-1] == b"":  # (the newline that ends the file)
        lines.pop()
        last = 0  # every line is whole
    out = []
    for n, ln in enumerate(lines, 1):
        try:
            out.append((n, msgspec.json.decode(ln, type=kind)))
        except msgspec.DecodeError as e:
            if torn_last and n == last:
                break
            cut = " (cut short?)" if n == last else ""
            raise ValueError(f"{path} line {n}: not a whole record{cut} ({e})") from None
    return out


class RunDir:
    """One run's directory. Checks come first (``check``, ``restore``), writing after
    (``create``), so a start that fails leaves nothing behind."""

    def __init__(self, path: str | Path, cfg: TrainConfig) -> None:
        self.path = Path(path)
        self.cfg = cfg
        self.episodes = self.path / "episodes"
        self.checkpoints = self.path / "checkpoints"
        self.state_path = self.checkpoints / "train-state.pt"
        # The outermost folder this run makes: removed again if the run fails before it has
        # kept anything (a failed start leaves nothing behind).
        self.made = next(
            (p for p in reversed((self.path, *self.path.parents)) if not p.exists()), None
        )
        self.created = False  # whether create() has run: before it, a new run has kept nothing
        self.extended_from: int | None = None  # a resume's `--set steps=N`: the steps it had
        self._digests: dict[str, str] | None = None  # the ledger's file bindings (kept_episode)

    def check(self, resume: bool) -> None:
        """A new run needs an empty (or absent) writable folder; a resumed one its config."""
        from collective.base.outputs import check_dir

        if resume:
            if not (self.path / "config.toml").exists():
                raise ValueError(f"{self.path}: no run to resume (no config.toml)")
            self._check_files()
            return
        check_dir(self.path, "run directory")
        if self.path.exists() and any(not _ours(p.name) for p in self.path.iterdir()):
            raise ValueError(
                f"{self.path} already holds a run; resume it with --resume or pick --out"
            )

    def _check_files(self) -> None:
        """Every file a resume will read or append to is a regular file (links followed) or
        absent: a FIFO would block the reader (or the appender) forever, a device feed it
        without end. Checked before anything is opened, the lock included."""
        names = [self.path / n for n in RUN_FILES]
        for folder in (self.checkpoints, self.episodes, self.path / "failed"):
            if folder.is_dir():  # (checkpoints/ holds the hf backend's model folders too)
                names += sorted(p for p in folder.rglob("*") if not p.is_dir())
        for path in names:
            check_input(path, "run directory")

    @contextmanager
    def lock(self, resume: bool) -> Iterator[None]:
        """Hold the run directory for this process, for as long as the run lasts: an exclusive
        ``flock`` on ``RUN/lock``, which the kernel releases however the process ends (kill -9
        leaves no stale lock). A second process is refused in one line naming the holder's pid,
        having changed nothing. The checks run before the lock (a folder that holds something
        else gets no lock file) and again under it (what another process did meanwhile); a
        resume's config is checked against the one the run began with. A new run that fails
        before ``create`` is removed again, under the lock, so nobody else's start can race it.
        """
        try:
            self.check(resume)
        except FileNotFoundError:  # (its write probe, or the folder, removed as it looked)
            raise ValueError(
                f"{self.path} changed while it was checked: another train is starting there"
            ) from None
        if not resume:  # what this run will have made (a racing start may make it first)
            self.made = next(
                (p for p in reversed((self.path, *self.path.parents)) if not p.exists()), None
            )
        held: BinaryIO | None = None
        checked = False
        try:
            with _ctrl_c_held_back():  # (no lock half taken, no folder made and left)
                held = self._take_lock(make=not resume)
                self.check(resume)
                if resume:
                    self._check_config()
                checked = True
            yield
        except BaseException:
            if checked and not resume and not self.created:
                self.remove_if_unstarted()
            raise
        finally:
            if held is not None:  # the lock goes with the file (also if a Ctrl-C lands here:
                held.close()  # then when the generator's frame is freed)

    def _take_lock(self, make: bool) -> BinaryIO:
        lock = self.path / LOCK
        for _ in range(100):
            try:
                if make:
                    self.path.mkdir(parents=True, exist_ok=True)
                f = open(lock, "a+b", buffering=0)  # noqa: SIM115  (held for the run)
                fd = f.fileno()
            except FileNotFoundError:
                raise ValueError(f"{self.path}: no run to resume (it was removed)") from None
            except OSError as e:
                raise ValueError(f"{lock}: cannot open the run's lock ({e.strerror})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = _holder(fd)
                f.close()
                if isinstance(e, BlockingIOError):
                    raise ValueError(
                        f"{self.path} is in use: {holder} is training there (it holds "
                        f"{lock}); wait for it to end or stop it"
                    ) from None
                raise ValueError(f"{lock}: cannot lock it ({e.strerror})") from None
            # A failed start removes its folder under the lock: if ours was removed between
            # open and flock, it locks nothing; try again on the path as it is now.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(lock))
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                return f
            f.close()
        raise ValueError(f"{lock}: cannot hold it (it keeps being removed)")

    def _check_config(self) -> None:
        """A resumed run is the run it began as: ``config.toml`` must say what it said then
        (``config.json`` holds that, with its digest), and the config this resume runs may
        differ from it only by ``steps`` (``--set steps=N``: extending a run)."""
        on_disk = load_config(self.path / "config.toml")
        record = self.path / "config.json"
        if (data := read_run_file(record)) is not None:
            try:
                began = json.loads(data)
                digest, fields = began["digest"], began["config"]
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"{record}: not a readable config record") from None
            # by field, not by digest: a field TrainConfig gained since, at its default, is no edit
            if digest != config_digest(on_disk) and (
                edits := _changes(config_changes(fields, on_disk))
            ):
                raise ValueError(
                    f"{self.path / 'config.toml'} was edited after the run began "
                    f"({edits}); a run "
                    "keeps one config: put it back, or train the new config with --out "
                    "(a resume may extend a run with --set steps=N)"
                )
        new = changed_fields(config_fields(on_disk), config_fields(self.cfg))
        if not new:
            return
        if set(new) != {"steps"}:
            new.pop("steps", None)
            raise ValueError(f"a resume may change only steps (--set steps=N), not {_changes(new)}")
        if self.cfg.steps < on_disk.steps:
            raise ValueError(
                f"--set steps={self.cfg.steps}: the run has steps = {on_disk.steps}; a resume "
                "may extend a run, not shorten it"
            )
        for w in mix(self.cfg):
            if w.time_limit != "constant" and w.time_limit_start != w.time_limit_end:
                whose = f"{w.label}'s time limit" if self.cfg.mix else "the run's time limit"
                raise ValueError(
                    f"--set steps={self.cfg.steps}: {whose} is {w.time_limit} over its steps; "
                    "extending it would change the schedule of the steps to come"
                )
        self.extended_from = on_disk.steps

    def restore(
        self, backend: Any, model: Any, learner: Any
    ) -> tuple[TrainState, dict[int, Any]] | None:
        """The saved weights, optimiser and position of a run (None if it never finished a
        step); one clear error for a state file that is truncated, corrupt, or does not fit the
        run's config (e.g. its [model] edited)."""
        if not self.state_path.exists():
            return None
        check_input(self.state_path, "training state")  # a FIFO would block torch.load
        try:
            # weights_only: a state file is data; loading one must not run pickled code.
            saved = torch.load(self.state_path, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises many kinds for a bad file; all mean the same here
            raise ValueError(
                f"{self.state_path}: not a readable training state (truncated or corrupt: "
                f"{first_line(e)}); the run cannot be resumed from it"
            ) from None
        try:
            backend.load_weights(model, saved["model"])
            model.version = int(saved["version"])
            learner.load_state(saved["learner"])
            state = msgspec.convert(saved["state"], TrainState)
            serving = {int(v): w for v, w in saved["serving"].items()}
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as e:
            raise ValueError(
                f"{self.state_path}: does not fit this run's config.toml (was [model] or the "
                f"optimiser changed?): {first_line(e)}"
            ) from None
        self.records_before(state.step)  # (refused now, before any work, if they are damaged)
        return state, serving

    def records_before(self, step: int) -> list[list[bytes]]:
        """The metrics and ledger lines of the steps before ``step``, checked whole
        (``_lines_before``): what a resume from ``step`` keeps."""
        return [_lines_before(self.path / name, kind, step) for name, kind in RECORDS]

    def create(self, resume: bool, step: int) -> None:
        """Make the folders, write the config (a new run), and cut what a stopped run wrote
        after its checkpoint: half-written episode files, metrics and ledger lines of steps
        the resume redoes (the kept lines checked first: ``_lines_before``)."""
        kept = self.records_before(step)
        for sub in ("checkpoints", "episodes", "plots"):
            (self.path / sub).mkdir(parents=True, exist_ok=True)
        if self.extended_from is not None:  # --set steps=N on resume: said where it happened
            change = {"step": step, "steps": self.cfg.steps, "was": self.extended_from}
            with (self.path / "resumes.jsonl").open("a") as f:
                f.write(json.dumps(change) + "\n")
        if not resume or self.extended_from is not None:
            _write_bytes(self.path / "config.toml", dump_config(self.cfg).encode())
        if not resume or self.extended_from is not None or not (self.path / "config.json").exists():
            record = {"digest": config_digest(self.cfg), "config": config_fields(self.cfg)}
            _write_bytes(self.path / "config.json", json.dumps(record).encode() + b"\n")
        self.created = True
        for leftover in [*self.episodes.glob(".*.tmp"), *self.checkpoints.glob(".*.tmp")]:
            leftover.unlink()
        for (name, _), lines in zip(RECORDS, kept, strict=True):
            _write_lines(self.path / name, lines)

    def finished_episodes(
        self, first_group: int, unexpected: Callable[[int, int, Episode], str] | None = None
    ) -> dict[tuple[int, int], Episode]:
        """Episodes already on disk for groups from ``first_group`` on: a resume uses them
        rather than run them again. Each must be the episode the run plays under its name:
        ``unexpected(group, member, episode)`` says how it is not (its config, seeds, policy
        version or commons), and such a file (planted, swapped, another run's) is refused in
        one line naming it, before any work."""
        found: dict[tuple[int, int], Episode] = {}
        for path in sorted(self.episodes.glob("g*-r*.msgpack")):
            key = episode_key(path.name)
            if key is None or key[0] < first_group or key[1] >= self.cfg.group_size:
                continue
            ep = load_episode(path)
            if unexpected is not None and (why := unexpected(*key, ep)):
                raise ValueError(
                    f"{path}: not the episode this run plays as group {key[0]} member {key[1]} "
                    f"({why}); move it out of the run directory and resume (the run plays that "
                    "episode again)"
                )
            found[key] = ep
        return found

    def kept_episode(self, group: int, member: int) -> Episode | None:
        """Episode ``member`` of group ``group``, if its file is kept (``keep_episodes``), and
        only if it is the file its step learned from (the digest its ledger line binds it by;
        a file swapped or planted since is refused in one line naming it)."""
        name = episode_name(group, member)
        path = self.episodes / name
        if not path.is_file():
            return None
        if self._digests is None:  # (the ledger's bindings, read once; commit adds to them)
            self._digests = {}
            for _, line in _records(
                self.path / "ledger.jsonl",
                read_run_file(self.path / "ledger.jsonl") or b"",
                Ledger,
                torn_last=True,
            ):
                self._digests.update(line.digests)
        bound = self._digests.get(name)
        if bound is not None and sealed_digest(path) != bound:
            raise ValueError(
                f"{path}: not the episode its step learned from (its digest is not the one "
                f"{self.path / 'ledger.jsonl'} binds it to): put the run's own file back"
            )
        return load_episode(path)

    def save_episode(self, group: int, member: int, ep: Episode) -> None:
        save_episode(ep, self.episodes / episode_name(group, member))

    def save_failed(self, group: int, member: int, ep: Episode) -> Path:
        """An episode a world error ended: kept for the world's author, never learned from."""
        failed = self.path / "failed" / episode_name(group, member)
        failed.parent.mkdir(exist_ok=True)
        save_episode(ep, failed)
        return failed

    def remove_if_unstarted(self) -> None:
        """A new run that failed before it kept anything (no step, no episode: a policy that
        cannot answer, a learner that fails on its first step) is removed, folders it made
        included, so that ``--out`` can be given again. Anything kept (an episode, a failed
        episode) stays: the run is resumable."""
        if any(self.path.glob("*/*.msgpack")):
            return
        if self.made is not None:
            shutil.rmtree(self.made, ignore_errors=True)
        else:  # the folder was there, empty (checked before the run): empty it again
            for p in self.path.iterdir():
                if p.name.startswith(PROBE):
                    continue  # (another start's, which it removes itself)
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)

    @trio.lowlevel.enable_ki_protection
    def commit(
        self,
        metrics: StepMetrics,
        ledger: Ledger,
        state: TrainState,
        checkpoint: dict[str, Any],
        write_latest: Any,
        logger: Any,
    ) -> None:
        """A finished step's records, all or none of them: Ctrl-C waits until they are written
        (a resume then finds metrics, ledger and checkpoint in step). ``checkpoint`` is what
        ``train-state.pt`` holds; ``write_latest(directory, snapshot)`` writes the backend's
        own checkpoint (tiny: ``latest.pt``, usable with ``--policy tiny:PATH``)."""
        with (self.path / "metrics.jsonl").open("ab") as f:
            f.write(msgspec.json.encode(metrics) + b"\n")
        if logger is not None:  # the same line, to TensorBoard or W&B
            logger.log(metrics.step, msgspec.to_builtins(metrics))
        ledger.digests = {
            n: sealed_digest(self.episodes / n)
            for n in ledger.used + ledger.dropped + ledger.flat
            if (self.episodes / n).is_file()
        }
        if self._digests is not None:
            self._digests.update(ledger.digests)
        with (self.path / "ledger.jsonl").open("ab") as f:
            f.write(msgspec.json.encode(ledger) + b"\n")
        snap = state.step % self.cfg.snapshot_every == 0 or state.step == self.cfg.steps
        write_latest(self.checkpoints, snapshot_name(state.step) if snap else None)
        save_torch({**checkpoint, "state": msgspec.to_builtins(state)}, self.state_path)
        if not self.cfg.keep_episodes:
            for n in ledger.used + ledger.dropped + ledger.flat:
                (self.episodes / n).unlink(missing_ok=True)


@contextmanager
def _ctrl_c_held_back() -> Iterator[None]:
    """A Ctrl-C while a run directory's lock is being taken and checked lands once that is
    done (held, or refused): never between making the folder and holding its lock, where
    nobody could remove the folder safely."""
    if threading.current_thread() is not threading.main_thread():
        yield  # (signals go to the main thread only)
        return
    pressed: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _: pressed.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pressed:
            signal.raise_signal(signal.SIGINT)  # to the handler there was: Ctrl-C, now


def _holder(fd: int) -> str:
    """Who holds a run's lock: the pid it wrote there (a moment after taking the lock)."""
    for _ in range(50):
        pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
        if pid:
            return f"process {pid}"
        time.sleep(0.02)
    return "another process"


def first_line(e: BaseException) -> str:
    """The telling line of an error from torch (its messages run to many lines)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    telling = [ln for ln in lines if "size mismatch" in ln or "Missing key" in ln]
    return f"{type(e).__name__}: {(telling or lines or [''])[0][:300]}"


def _changes(fields: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in fields.items())


def _write_lines(path: Path, lines: Sequence[bytes]) -> None:
    _write_bytes(path, b"".join(line + b"\n" for line in lines))


def _write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _lines_before(path: Path, kind: type[StepMetrics] | type[Ledger], step: int) -> list[bytes]:
    """The lines of a step-by-step JSON-lines file (metrics, ledger) for the steps before
    ``step``, the steps a resume keeps (it redoes the rest). They must be there, whole, one a
    step in order: a kill while a line was written leaves a cut last line, but only of a step
    the resume redoes (a step's lines are written before its checkpoint). Anything else (a line
    cut short, missing, repeated or out of order among the kept steps) means the file was
    damaged after the fact, and what it lost cannot be proven from what is left: refused in one
    line naming the file and the line, with nothing changed."""
    if step == 0:
        return []
    data = read_run_file(path) or b""
    lines = data.split(b"\n")
    records = _records(path, data, kind, torn_last=True)
    for want in range(step):
        if want >= len(records):
            n = len(records) + 1
            what = (
                f"line {n} is cut short"
                if n <= len(lines) and lines[n - 1]
                else f"it ends at line {n - 1}"
            )
            raise ValueError(
                f"{path}: step {want}'s line is lost ({what}; the checkpoint is at step {step}): "
                "the run cannot be resumed as it was; put the file back, or train anew with --out"
            )
        n, record = records[want]
        if record.step != want:
            raise ValueError(
                f"{path} line {n}: step {record.step} where step {want} belongs (lines lost, "
                "repeated or out of order): the run cannot be resumed as it was; put the file "
                "back, or train anew with --out"
            )
    return lines[:step]
