"""Bad and hostile input to the command line, one row per case: what a careful user (or an
adversary) types, the exit code it must get, and a fragment of the one-line message.

Every row runs the real command in-process (``main([...])``, output captured), which is what
the console script calls; the few behaviours that need a real process (Ctrl-C, a missing
optional package) are tested in subprocesses below the table. For every error (exit 2) the
table also checks: one line on stderr, no traceback, and, for ``train``, no run directory left
behind. Placeholders in braces name files the ``env`` fixture makes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest

from collective import EpisodeConfig, load_episode, run_episode, save_episode
from collective.cli import main
from collective.records import encode_episode, episode_file_bytes, episode_parts
from collective.rl.make_model import make_tiny_lm
from collective.rl.rundir import RunDir
from collective.rl.train import load_config, read_metrics, train
from policy.tiny import TinyConfig, TinyModel
from policy.tiny.checkpoint import save_checkpoint
from policy.uniform import RandomPolicy
from tests.support import FRAGILE, HOSTILE, ROOT
from tests.support.busy import scaled
from tests.support.cli import CLI_AT_A_TERMINAL, ctrl_c_everywhere
from tests.support.hostile import seal, seal_parts
from tests.support.training import SMALL_TOML, comparable_metrics

FAULTY = f"{FRAGILE}:Faulty"
QUICK_CHECK = ["--agents", "2", "--seeds", "1", "--rollouts", "2", "--time-limit", "60"]
CLI = [sys.executable, "-m", "collective.cli"]


BIG = str(2**64)
TRAIN = ["train", "{small}", "--out", "{newrun}", "--quiet"]
STUDY = ["--policies", "random", "--out", "{tmp}/study", "--quiet"]
HF_SERVER_BAD = 'hf_server="sglang:http://[::1"'
HF_SERVER_9 = 'hf_server="sglang:http://127.0.0.1:9"'

# The run directory's files a resume reads or appends to, each replaced by a FIFO in a copy.
RUN_FIFOS = {
    "config.json": "config",
    "metrics.jsonl": "metrics",
    "ledger.jsonl": "ledger",
    "resumes.jsonl": "resumes",
    "baselines.json": "baselines",
    "wandb-run-id": "wandb",
    "config.digest": "digest",
    "lock": "lock",
    "checkpoints/train-state.pt": "state",
    "episodes/g000000-r00.msgpack": "episode",
}
# `collective experiment signs-of-life`: (its arguments, a fragment of the one-line error)
EXPERIMENT: list[tuple[list[str], str]] = [
    (["--seeds", "-1"], "--seeds: expected a whole number >= 0, got '-1'"),
    (["--seeds", str(2**70)], f"--seeds {2**70}: at most 1,000"),
    (["--steps", "-1"], "--steps: expected a whole number >= 0, got '-1'"),
    (["--steps", str(2**70)], "steps must be >= 1 (a 64-bit integer)"),
    (["--instances", "-1"], "--instances: expected a whole number >= 0"),
    (["--jobs", "0"], "--jobs must be >= 1, got 0"),
    (["--only", "nope"], "--only: unknown variants ['nope']"),
    (["--only", "per_agent"], "--only must include main"),
    (["--seeds", "abc"], "--seeds: expected a whole number >= 0, got 'abc'"),
    (["--nosuch"], "unrecognized arguments: --nosuch"),
]
# (command, flag, text, fragment): numbers in the syntaxes a flag once took and --param did not
NUMBERS: list[tuple[list[str], str, str, str]] = [
    (
        ["study", "scale", "", *STUDY],
        "--agents",
        "1,,2",
        "comma-separated whole numbers, got '1,,2'",
    ),
    (
        ["study", "scale", "", *STUDY],
        "--agents",
        "1,2,",
        "comma-separated whole numbers, got '1,2,'",
    ),
    (["check", "tally"], "--limits", "100,,200", "comma-separated numbers, got '100,,200'"),
    (["run", "tally"], "--agents", "\u0663", "digits are 0-9"),
    (["run", "tally"], "--agents", "\uff13", "digits are 0-9"),
    (["run", "tally"], "--agents", " 3", "no spaces around a number"),
    (["run", "tally"], "--agents", "1_0", "no _ in a number"),
    (["run", "tally"], "--seed", "0x10", "expected a whole number, got '0x10'"),
    (["run", "tally"], "--time-limit", "\u0661\u0662", "digits are 0-9"),
    (["run", "tally"], "--param", "target= 12 ", "spaces around the value"),
    (["run", "tally"], "--param", "target=\u0661\u0662", "digits are 0-9"),
    (["run", "tally"], "--param", "target=\uff11\uff12", "digits are 0-9"),
    (["show", "{episode}"], "--limit", "\u0663", "digits are 0-9"),
    (["trace", "{episode}"], "--agents", "0,,2", "expected ids and ranges like 0-9,42, got ''"),
    (["replay", "{episode}"], "--until", "1e", "expected a number, got '1e'"),
]

# (id, argv, exit code, fragment of the message)
CASES: list[tuple[str, list[str], int, str]] = [
    # -- run: names ----------------------------------------------------------------------------
    ("unknown world", ["run", "atlantis"], 2, "unknown world 'atlantis'"),
    ("world file missing", ["run", "{tmp}/nowhere.py:W"], 2, "no file"),
    (
        "world file without its class",
        ["run", str(HOSTILE)],
        2,
        f"is a file: name its World class, {HOSTILE}:ClassName ({HOSTILE} defines ",
    ),
    ("no such class", ["run", f"{HOSTILE}:Nothing"], 2, "no World subclass named 'Nothing'"),
    ("module missing", ["run", "no_such_module_xyz:W"], 2, "cannot import module"),
    ("world without score()", ["run", f"{HOSTILE}:Scoreless"], 2, "defines no score() -> float"),
    ("world constructor raises", ["run", f"{HOSTILE}:Exploding"], 2, "the constructor blew up"),
    ("unknown parameter", ["run", "workshop", "--param", "nosuch=1"], 2, "no parameter 'nosuch'"),
    ("bad parameter value", ["run", "relay", "--param", "size=0"], 2, "size must be >= 1"),
    ("unknown organisation", ["run", "tally", "--org", "nope"], 2, "unknown organisation"),
    ("organisation option", ["run", "tally", "--org", "flat:3"], 2, "takes no option"),
    ("unknown latency", ["run", "tally", "--latency", "nope"], 2, "unknown latency preset"),
    ("unknown policy", ["run", "tally", "--policy", "nope"], 2, "unknown policy"),
    ("checkpoint missing", ["run", "tally", "--policy", "tiny:{tmp}/x.pt"], 2, "no such check"),
    ("checkpoint garbage", ["run", "tally", "--policy", "tiny:{garbage}"], 2, "not a readable"),
    ("bad clock", ["run", "tally", "--clock", "sundial"], 2, "invalid choice"),
    ("agents not a number", ["run", "tally", "--agents", "10**12"], 2, "whole number, got '10**"),
    # -- run: a world's definition, checked before the first event ------------------------------
    ("tool named msg", ["run", "{prim}:Prim"], 2, "Prim.msg: a tool may not be named like the"),
    ("negative duration", ["run", "{negdur}:Slow"], 2, "Slow.go: duration must be a finite number"),
    ("self.add hides add", ["run", f"{HOSTILE}:Hider"], 2, "self.add (list) hides the tool 'add'"),
    ("no super().__init__", ["run", f"{HOSTILE}:NoSuper"], 2, "does not call super().__init__"),
    ("world without observe", ["run", f"{HOSTILE}:Blind"], 2, "defines no observe(agent) -> str"),
    ("duration typo", ["run", f"{HOSTILE}:DurationTypo"], 2, "duration names attribute 'sconds'"),
    ("domain typo", ["run", f"{HOSTILE}:DomainTypo"], 2, "the domain of 'n' names attribute 'mx'"),
    ("param not an int", ["run", "tally", "--param", "target=abc"], 2, "Expected `int`, got `str`"),
    ("param set by engine", ["run", "tally", "--param", "seed=3"], 2, "set by the engine"),
    ("param 10^30", ["run", "tally", "--param", f"target={10**30}"], 2, "integers must be within"),
    ("param Infinity, int", ["run", "tally", "--param", "target=Infinity"], 2, "got `float`"),
    ("wall time Infinity", ["run", "repo", "--param", "wall_seconds=Infinity"], 2, "be finite"),
    ("wall time inf", ["run", "repo", "--param", "wall_seconds=inf"], 2, "=inf: numbers must be"),
    ("wall time NaN", ["run", "repo", "--param", "wall_seconds=NaN"], 2, "=nan: numbers must be"),
    ("world file exits", ["run", "{exits}:W"], 2, "exits.py failed: SystemExit: 3"),
    ("world file BaseException", ["run", "{base}:W"], 2, "base.py failed: BaseException: no"),
    ("relative module", ["run", ".tally:Tally"], 2, "'.tally' is a relative module name"),
    (
        "sglang URL garbled",
        ["run", "tally", "--policy", "sglang:http://[::1"],
        2,
        "not a valid URL",
    ),
    # -- run: a world's bug, found running: the episode stops, says where, is kept -------------
    (
        "world bug in a tool",
        ["run", f"{FAULTY}", "--param", "bug=tool", "--out", "{tmp}/bug.msgpack"],
        2,
        "Faulty.add (tool, agent 0) raised KeyError: 'no such thing' at fragile.py:",
    ),
    ("score of 1.5", ["run", f"{FAULTY}", "--param", "bug=score"], 2, "score() returned 1.5"),
    ("observe says 42", ["run", f"{FAULTY}", "--param", "bug=observe-int"], 2, "returned int 42"),
    # -- check ---------------------------------------------------------------------------------
    ("check nothing", ["check", "atlantis"], 2, "unknown world 'atlantis'"),
    ("check one rollout", ["check", "tally", "--rollouts", "1"], 2, "--rollouts >= 2"),
    ("check a bad param", ["check", "tally", "--param", "target=x"], 2, "Expected `int`"),
    ("check limits nan", ["check", "tally", "--limits", "nan"], 2, "check --limits nan: read"),
    ("check limits -5", ["check", "tally", "--limits", "-5"], 2, "check --limits -5.0: read"),
    ("check limit past T", ["check", "tally", "--limits", "700"], 2, "must be in (0, T = 600]"),
    ("check time limit nan", ["check", "tally", "--time-limit", "nan"], 2, "must be finite"),
    ("check has no targets", ["check", "tally", "--targets", "2"], 2, "unrecognized arguments"),
    (  # every episode of a check runs at once and is kept: the total, before any is built
        "check seeds 2^70",
        ["check", "tally", "--seeds", str(2**70)],
        2,
        f"check: {4 * 2**70:,} episodes at once ({2**70:,} seeds x 4 rollouts of 4 agents) need",
    ),
    ("check rollouts 2^70", ["check", "tally", "--rollouts", str(2**70)], 2, "rollouts of 4 age"),
    (
        "study seeds 2^70",
        ["study", "scale", "", "--seeds", str(2**70), *STUDY],
        2,
        f"study: a cell of {2**70:,} episodes: {2**70:,} agents need at least",
    ),
    (
        "study no agents",
        ["study", "scale", "", "--agents", "", *STUDY],
        2,
        "expected comma-separated whole numbers, got ''",
    ),
    ("study target 2", ["study", "scale", "", "--targets", "2", *STUDY], 2, "--targets (2.0,)"),
    ("study limit nan", ["study", "scale", "", "--limits", "nan", *STUDY], 2, "--limits (nan,)"),
    ("study bad world", ["study", "scale", "", "--world", "nope", *STUDY], 2, "unknown world"),
    (
        "check a world bug",
        ["check", f"{FAULTY}", "--param", "bug=tool", *QUICK_CHECK],
        2,
        "raised KeyError: 'no such thing' at fragile.py:",
    ),
    (
        "check a score of 1.5",
        ["check", f"{FAULTY}", "--param", "bug=score", *QUICK_CHECK],
        2,
        "score() returned 1.5",
    ),
    ("check without a world", ["check"], 2, "check needs a WORLD, or --config CONFIG.toml"),
    ("check an unknown policy", ["check", "tally", "--policy", "nope"], 2, "unknown policy 'nope'"),
    ("check unseeded", ["check", f"{FRAGILE}:Unseeded", *QUICK_CHECK], 1, "FAIL  the same seed"),
    ("check a liar", ["check", f"{FRAGILE}:Liar", *QUICK_CHECK], 1, "monotone = True, but"),
    # -- run: numbers --------------------------------------------------------------------------
    ("seed over 2^64-1", ["run", "tally", "--seed", BIG], 2, "world_seed must be in 0..2**64-1"),
    ("negative seed", ["run", "tally", "--seed", "-1"], 2, "world_seed must be in"),
    ("sample seed over", ["run", "tally", "--sample-seed", BIG], 2, "sample_seed must be in"),
    ("time limit inf", ["run", "tally", "--time-limit", "inf"], 2, "time_limit must be finite"),
    ("time limit nan", ["run", "tally", "--time-limit", "nan"], 2, "time_limit must be finite"),
    ("time limit 0", ["run", "tally", "--time-limit", "0"], 2, "time_limit must be > 0"),
    ("no agents", ["run", "tally", "--agents", "0"], 2, "agents must be >= 1"),
    ("negative budget", ["run", "tally", "--budget", "-1"], 2, "budget must be >= 0"),
    ("max events 0", ["run", "tally", "--max-events", "0"], 2, "max_events must be in 1..2**63"),
    ("max events 2^70", ["run", "tally", "--max-events", str(2**70)], 2, "max_events must be in"),
    ("temperature 0", ["run", "tally", "--temperature", "0"], 2, "temperature must be > 0"),
    ("top-p 0", ["run", "tally", "--top-p", "0"], 2, "top_p must be in (0, 1]"),
    ("top-p 1.5", ["run", "tally", "--top-p", "1.5"], 2, "top_p must be in (0, 1]"),
    (
        "top-p with the tiny model",
        ["run", "tally", "--top-p", "0.9", "--policy", "tiny"],
        2,
        "the tiny model samples with top_p = 1 only",
    ),
    ("10^12 agents", ["run", "workshop", "--agents", "1000000000000"], 2, "agents need at least"),
    ("10^9 modules", ["run", "workshop", "--param", "size=1000000000"], 2, "more memory than half"),
    ("a world too big", ["run", f"{FRAGILE}:Vast"], 2, "the world needs at least 3.0 PiB"),
    ("footprint raises", ["run", f"{FRAGILE}:Unmeasured"], 2, "footprint() raised ZeroDivision"),
    # -- run: outputs --------------------------------------------------------------------------
    ("out is a device", ["run", "tally", "--out", "/dev/full"], 2, "is a device"),
    ("out is /dev/null", ["run", "tally", "--out", "/dev/null"], 2, "is a device"),
    ("out is a FIFO", ["run", "tally", "--out", "{fifo}"], 2, "is a FIFO"),
    ("out is a directory", ["run", "tally", "--out", "{tmp}"], 2, "is a directory"),
    ("out links to a dir", ["run", "tally", "--out", "{dirlink}"], 2, "a link to"),
    ("out links nowhere", ["run", "tally", "--out", "{deadlink}"], 2, "a link to nothing"),
    ("out under a file", ["run", "tally", "--out", "{file}/ep.msgpack"], 2, "not a folder"),
    ("out in /proc", ["run", "tally", "--out", "/proc/ep.msgpack"], 2, "cannot write in /proc"),
    ("out in /sys", ["run", "tally", "--out", "/sys/ep.msgpack"], 2, "cannot write in /sys"),
    ("out names a folder", ["run", "tally", "--out", "{tmp}/.."], 2, "names a folder"),
    # -- replay, show, diff: broken files ------------------------------------------------------
    ("episode missing", ["replay", "{tmp}/none.msgpack"], 2, "cannot read episode file"),
    ("episode empty", ["replay", "{empty}"], 2, "empty file"),
    ("episode is text", ["replay", "{text}"], 2, "no episode header"),
    ("episode truncated", ["replay", "{truncated}"], 2, "truncated"),
    ("episode extended", ["replay", "{extended}"], 2, "bytes added"),
    ("episode byte flipped", ["replay", "{flipped}"], 2, "does not match its digest"),
    ("episode format 1", ["replay", "{format1}"], 2, "format 1"),
    ("unknown field, sealed", ["replay", "{unknown}"], 2, "unknown field"),
    ("show a broken file", ["show", "{flipped}"], 2, "does not match its digest"),
    ("no prompts to show", ["show", "{unprompted}", "--observations"], 2, "keep_prompts = false"),
    ("show --limit -1", ["show", "{episode}", "--limit", "-1"], 2, "expected a whole number >= 0"),
    ("trace a broken file", ["trace", "{flipped}"], 2, "does not match its digest"),
    ("trace out is a device", ["trace", "{episode}", "--out", "/dev/full"], 2, "is a device"),
    ("show --png a device", ["show", "{episode}", "--png", "/dev/full"], 2, "is a device"),
    ("diff a broken file", ["diff", "{episode}", "{flipped}"], 2, "does not match its digest"),
    # -- an output never destroys an input (device and inode, links resolved) --------------
    ("trace over its episode", ["trace", "{episode}", "--out", "{episode}"], 2, "is an input"),
    ("trace over a link to it", ["trace", "{episode}", "--out", "{eplink}"], 2, "the same file"),
    ("trace over a hard link", ["trace", "{episode}", "--out", "{ephard}"], 2, "is an input"),
    (
        "fork over its episode",
        ["replay", "{episode}", "--until", "5", "--out", "{episode}"],
        2,
        "is an input",
    ),
    ("png over its episode", ["show", "{episode}", "--png", "{eplink}"], 2, "is an input"),
    (
        "run over its world",
        ["run", "{worldcopy}:Counter", "--out", "{worldcopy}"],
        2,
        "is an input",
    ),
    (
        "run over its weights",
        ["run", "tally", "--policy", "tiny:{ckpt}", "--out", "{ckpt}"],
        2,
        "is an input",
    ),
    # -- outputs the file system cannot take ---------------------------------------------------
    ("run --out ''", ["run", "tally", "--out", ""], 2, "--out: an empty path"),
    ("fork --out ''", ["replay", "{episode}", "--until", "5", "--out", ""], 2, "an empty path"),
    ("trace --out ''", ["trace", "{episode}", "--out", ""], 2, "--out: an empty path"),
    ("show --png ''", ["show", "{episode}", "--png", ""], 2, "--png: an empty path"),
    (
        "out ends in /",
        ["run", "tally", "--out", "{tmp}/new/"],
        2,
        "new/ names a folder, not a file",
    ),
    ("out is a link loop", ["run", "tally", "--out", "{loop}"], 2, "(a symlink loop)"),
    ("out through a loop", ["run", "tally", "--out", "{loop}/e"], 2, "Too many levels of symbolic"),
    (
        "out name of 300 bytes",
        ["run", "tally", "--out", "{tmp}/" + "a" * 300],
        2,
        "300 bytes, longer",
    ),
    ("make-model under a file", ["make-model", "tiny-lm", "{file}/m"], 2, "(Not a directory)"),
    (
        "study out is a file",
        ["study", "scale", "{ckpt}", "--out", "{file}"],
        2,
        "a file, not a folder",
    ),
    # -- decoding is bounded by the file's own limits ------------------------------------------
    ("10^6 ids: observations", ["show", "{many_ids}", "--observations"], 2, "more than 65 tokens"),
    ("10^6 ids: replay", ["replay", "{many_ids}"], 2, "a turn of more than 65 tokens"),
    ("10^6 ids: trace", ["trace", "{many_ids}", "--out", "{tmp}/ids.json"], 2, "more than 65"),
    ("params 1000 deep: show", ["show", "{deep}"], 2, "nested too deep"),
    ("params 1000 deep: replay", ["replay", "{deep}"], 2, "nested too deep"),
    ("params 40 deep: file", ["show", "{deep40}"], 2, "params nest deeper than 32 levels"),
    (
        "params 40 deep: run",
        ["run", "tally", "--param", "x=" + "[" * 40 + "]" * 40],
        2,
        "nest deeper",
    ),
    ("one body: 10^6 ids", ["show", "{legacy_ids}"], 2, "a turn of more than 65 tokens"),
    ("one body: agent 99", ["trace", "{legacy_ghost}"], 2, "concerns agent 99, of 3 spawned"),
    ("trace --agents ''", ["trace", "{episode}", "--agents", ""], 2, "no agent ids given"),
    (
        "trace --agents 0-10^11",
        ["trace", "{episode}", "--agents", "0-100000000000", "--out", "{tmp}/all.json"],
        0,
        '"agents": 3',
    ),
    ("outcome before its turn: show", ["show", "{outcome_first}"], 2, "not a valid episode body"),
    (
        "outcome before its turn: show --png",
        ["show", "{outcome_first}", "--png", "{tmp}/x.png"],
        2,
        "not a valid episode body",
    ),
    (
        "outcome before its turn: show --observations",
        ["show", "{outcome_first}", "--observations"],
        2,
        "not a valid episode body",
    ),
    (
        "outcome before its turn: trace --out",
        ["trace", "{outcome_first}", "--out", "{tmp}/x.json"],
        2,
        "not a valid episode body",
    ),
    (
        "outcome before its turn: diff",
        ["diff", "{episode}", "{outcome_first}"],
        2,
        "not a valid episode body",
    ),
    (
        "outcome before its turn: replay",
        ["replay", "{outcome_first}"],
        2,
        "not a valid episode body",
    ),
    ("an end recorded twice: show", ["show", "{ends_twice}"], 2, "not a valid episode body"),
    (
        "an end recorded twice: show --png",
        ["show", "{ends_twice}", "--png", "{tmp}/x.png"],
        2,
        "not a valid episode body",
    ),
    (
        "an end recorded twice: show --observations",
        ["show", "{ends_twice}", "--observations"],
        2,
        "not a valid episode body",
    ),
    (
        "an end recorded twice: trace --out",
        ["trace", "{ends_twice}", "--out", "{tmp}/x.json"],
        2,
        "not a valid episode body",
    ),
    (
        "an end recorded twice: diff",
        ["diff", "{episode}", "{ends_twice}"],
        2,
        "not a valid episode body",
    ),
    ("an end recorded twice: replay", ["replay", "{ends_twice}"], 2, "not a valid episode body"),
    ("an end index of 10^6: show", ["show", "{end_index}"], 2, "not a valid episode body"),
    (
        "an end index of 10^6: show --png",
        ["show", "{end_index}", "--png", "{tmp}/x.png"],
        2,
        "not a valid episode body",
    ),
    (
        "an end index of 10^6: show --observations",
        ["show", "{end_index}", "--observations"],
        2,
        "not a valid episode body",
    ),
    (
        "an end index of 10^6: trace --out",
        ["trace", "{end_index}", "--out", "{tmp}/x.json"],
        2,
        "not a valid episode body",
    ),
    (
        "an end index of 10^6: diff",
        ["diff", "{episode}", "{end_index}"],
        2,
        "not a valid episode body",
    ),
    ("an end index of 10^6: replay", ["replay", "{end_index}"], 2, "not a valid episode body"),
    ("a commit by agent 99: show", ["show", "{ghost_commit}"], 2, "not a valid episode body"),
    (
        "a commit by agent 99: show --png",
        ["show", "{ghost_commit}", "--png", "{tmp}/x.png"],
        2,
        "not a valid episode body",
    ),
    (
        "a commit by agent 99: show --observations",
        ["show", "{ghost_commit}", "--observations"],
        2,
        "not a valid episode body",
    ),
    (
        "a commit by agent 99: trace --out",
        ["trace", "{ghost_commit}", "--out", "{tmp}/x.json"],
        2,
        "not a valid episode body",
    ),
    (
        "a commit by agent 99: diff",
        ["diff", "{episode}", "{ghost_commit}"],
        2,
        "not a valid episode body",
    ),
    ("a commit by agent 99: replay", ["replay", "{ghost_commit}"], 2, "not a valid episode body"),
    ("a delivery to agent 99: show", ["show", "{ghost_delivery}"], 2, "not a valid episode body"),
    (
        "a delivery to agent 99: show --png",
        ["show", "{ghost_delivery}", "--png", "{tmp}/x.png"],
        2,
        "not a valid episode body",
    ),
    (
        "a delivery to agent 99: show --observations",
        ["show", "{ghost_delivery}", "--observations"],
        2,
        "not a valid episode body",
    ),
    (
        "a delivery to agent 99: trace --out",
        ["trace", "{ghost_delivery}", "--out", "{tmp}/x.json"],
        2,
        "not a valid episode body",
    ),
    (
        "a delivery to agent 99: diff",
        ["diff", "{episode}", "{ghost_delivery}"],
        2,
        "not a valid episode body",
    ),
    (
        "a delivery to agent 99: replay",
        ["replay", "{ghost_delivery}"],
        2,
        "not a valid episode body",
    ),
    ("a closing that miscounts: show", ["show", "{counts}"], 2, "not a valid episode body"),
    (
        "a closing that miscounts: show --png",
        ["show", "{counts}", "--png", "{tmp}/x.png"],
        2,
        "not a valid episode body",
    ),
    (
        "a closing that miscounts: show --observations",
        ["show", "{counts}", "--observations"],
        2,
        "not a valid episode body",
    ),
    (
        "a closing that miscounts: trace --out",
        ["trace", "{counts}", "--out", "{tmp}/x.json"],
        2,
        "not a valid episode body",
    ),
    (
        "a closing that miscounts: diff",
        ["diff", "{episode}", "{counts}"],
        2,
        "not a valid episode body",
    ),
    ("a closing that miscounts: replay", ["replay", "{counts}"], 2, "not a valid episode body"),
    # -- replay: trust and options -------------------------------------------------------------
    ("file world not named", ["replay", "{foreign}"], 2, "not built in"),
    ("fork of file world", ["replay", "{foreign}", "--until", "5"], 2, "not built in"),
    ("out without until", ["replay", "{episode}", "--out", "{tmp}/f.msgpack"], 2, "needs --until"),
    ("seed without until", ["replay", "{episode}", "--seed", "3"], 2, "--seed needs --until"),
    ("fork before 0", ["replay", "{episode}", "--until", "-1"], 2, "outside the episode"),
    ("fork after the end", ["replay", "{episode}", "--until", "1e9"], 2, "outside the episode"),
    (
        "fork out is a device",
        ["replay", "{episode}", "--until", "5", "--out", "/dev/full"],
        2,
        "is a device",
    ),
    ("replay policy unknown", ["replay", "{episode}", "--policy", "nope"], 2, "unknown policy"),
    # -- replay: consistent forgeries (a valid file that is not what ran) -> exit 1 ------------
    ("forged result", ["replay", "{forged_result}"], 1, "result"),
    ("forged token ids", ["replay", "{forged_ids}"], 1, "token ids spell"),
    ("forged score", ["replay", "{forged_score}"], 1, "score"),
    ("forged stats", ["replay", "{forged_stats}"], 1, "stats"),
    ("forged curve", ["replay", "{forged_curve}"], 1, "curve"),
    ("forged prompt", ["replay", "{forged_prompt}"], 1, "prompt"),
    ("forged logprob > 0", ["replay", "{forged_logprob}"], 1, "must be finite and <= 0"),
    ("forged logprobs", ["replay", "{forged_lp}", "--policy", "random"], 1, "logprobs"),
    ("diff: config only", ["diff", "{episode}", "{other_config}"], 1, "config policy"),
    # -- train: the config ---------------------------------------------------------------------
    ("config missing", ["train", "{tmp}/none.toml", "--out", "{newrun}"], 2, "cannot read config"),
    ("config not TOML", ["train", "{text}", "--out", "{newrun}"], 2, "not valid TOML"),
    ("unknown field", [*TRAIN, "--set", "nosuch=1"], 2, "unknown field `nosuch`"),
    ("--set into a number", [*TRAIN, "--set", "steps.x=1"], 2, "steps is not a table"),
    ("--set without =", [*TRAIN, "--set", "steps"], 2, "expected KEY=VALUE"),
    ("train: unknown world", [*TRAIN, "--set", "world=nope"], 2, "unknown world 'nope'"),
    ("train: unknown latency", [*TRAIN, "--set", "latency=nope"], 2, "unknown latency"),
    ("train: unknown org", [*TRAIN, "--set", "org=nope"], 2, "unknown organisation"),
    (
        "train: scoreless",
        [*TRAIN, "--set", f"world={HOSTILE}:Scoreless", "--set", "params={{}}"],
        2,
        "defines no score()",
    ),
    ("train: init garbage", [*TRAIN, "--set", "init={garbage}"], 2, "not a readable"),
    ("train: init missing", [*TRAIN, "--set", "init={tmp}/none.pt"], 2, "no such checkpoint"),
    (
        "init vs [model]",
        [*TRAIN, "--set", "init={ckpt}", "--set", "model.d_model=32"],
        2,
        "d_model = 64 (config says 32)",
    ),
    ("train: limit inf", [*TRAIN, "--set", "time_limit_start=inf"], 2, "finite and > 0"),
    ("snapshot every 0", [*TRAIN, "--set", "snapshot_every=0"], 2, "snapshot_every must be >= 1"),
    ("snapshot every -1", [*TRAIN, "--set", "snapshot_every=-1"], 2, "integer), not -1"),
    ("chunk 0", [*TRAIN, "--set", "chunk=0"], 2, "chunk must be >= 1 (a 64-bit integer), not 0"),
    ("chunk -1", [*TRAIN, "--set", "chunk=-1"], 2, "chunk must be >= 1 (a 64-bit integer), not -1"),
    ("entropy nan", [*TRAIN, "--set", "entropy_coef=nan"], 2, "entropy_coef must be finite"),
    ("penalty nan", [*TRAIN, "--set", "latency_penalty=nan"], 2, "latency_penalty must be fin"),
    ("penalty -inf", [*TRAIN, "--set", "latency_penalty=-inf"], 2, "and >= 0, not -inf"),
    ("learning rate inf", [*TRAIN, "--set", "learning_rate=inf"], 2, "learning_rate must be fin"),
    ("grad norm nan", [*TRAIN, "--set", "max_grad_norm=nan"], 2, "max_grad_norm must be finite"),
    ("grad norm -1", [*TRAIN, "--set", "max_grad_norm=-1.0"], 2, "and > 0, not -1.0"),
    (
        "hf_server on tiny",
        [*TRAIN, "--set", 'hf_server="sglang:http://127.0.0.1:1"'],
        2,
        "model = 'tiny' has no hf_server = \"sglang:http://127.0.0.1:1\"",
    ),
    (
        "hf_server garbled",
        [*TRAIN, "--set", 'backend="hf"', "--set", "hf_model={tmp}", "--set", HF_SERVER_BAD],
        2,
        "hf_server: policy sglang:http://[::1: 'http://[::1' is not a valid URL",
    ),
    (
        "train: param inf",
        [*TRAIN, "--set", "world=workshop", "--set", "params={{work_seconds = inf}}"],
        2,
        "parameter work_seconds=inf: numbers must be finite",
    ),
    ("train: limit 0", [*TRAIN, "--set", "time_limit_end=0.0"], 2, "finite and > 0"),
    ("train seed over", [*TRAIN, "--set", f"seed={BIG}"], 2, "seed must be in 0..2**64-1"),
    ("group of one", [*TRAIN, "--set", "group_size=1"], 2, "group_size must be >= 2"),
    ("no steps", [*TRAIN, "--set", "steps=0"], 2, "steps must be >= 1"),
    ("team of 0", [*TRAIN, "--set", "team_sizes=[0]"], 2, "team_sizes must be >= 1"),
    ("10^12 in flight", [*TRAIN, "--set", "concurrency=1000000000000"], 2, "agents need at least"),
    ("model too big", [*TRAIN, "--set", "model.d_model=1000000"], 2, "needs more memory"),
    ("bad model shape", [*TRAIN, "--set", "model.n_heads=3"], 2, "not divisible"),
    ("hf without a model", [*TRAIN, "--set", 'backend="hf"'], 2, "needs model.path"),
    ("unknown cluster", [*TRAIN, "--set", "cluster.backend=slurm"], 2, "Invalid enum value"),
    ("no workers", [*TRAIN, "--set", "cluster.rollout_workers=0"], 2, "rollout_workers must be"),
    (
        "Ray not there",
        [*TRAIN, "--set", "cluster.backend=ray", "--set", "cluster.address=127.0.0.1:1"],
        2,
        "no Ray answers there",
    ),
    (
        "Ray address garbled",
        [*TRAIN, "--set", "cluster.backend=ray", "--set", "cluster.address=nohostport"],
        2,
        "expected '' (a local Ray), 'auto'",
    ),
    # -- train: fails once running, before it has kept anything: one line, nothing left ----
    ("train: no room to act", [*TRAIN, "--set", "max_output_tokens=3"], 2, "cannot fit the"),
    # -- train: the run directory --------------------------------------------------------------
    ("train: no --out", ["train", "{small}"], 2, "--out RUN_DIR"),
    ("run dir is a device", ["train", "{small}", "--out", "/dev/full"], 2, "a device, not a"),
    ("run dir is a file", ["train", "{small}", "--out", "{file}"], 2, "a file, not a folder"),
    ("run dir holds a run", ["train", "{small}", "--out", "{run}"], 2, "already holds a run"),
    ("run dir in /proc", ["train", "{small}", "--out", "/proc/run"], 2, "cannot write in /proc"),
    # -- train: resume -------------------------------------------------------------------------
    ("resume nothing", ["train", "--resume", "{tmp}/none"], 2, "no run to resume"),
    ("resume and --set", ["train", "--resume", "{run}", "--set", "seed=3"], 2, "only --set steps"),
    ("resume, a config", ["train", "{small}", "--resume", "{run}"], 2, "takes no config or --out"),
    ("resume shortens", ["train", "--resume", "{run}", "--set", "steps=1"], 2, "not shorten it"),
    (
        "config.toml edited",
        ["train", "--resume", "{run_edited}"],
        2,
        "config.toml was edited after the run began (seed 0 -> 3, learning_rate 0.003 -> 0.01",
    ),
    (
        "schedule extended",
        ["train", "--resume", "{run_linear}", "--set", "steps=4"],
        2,
        "the run's time limit is linear over its steps; extending it would change the schedule",
    ),
    ("run dir in use", ["train", "{small}", "--out", "{held}"], 2, "is in use: process {pid}"),
    ("resume in use", ["train", "--resume", "{run_held}"], 2, "is in use: process {pid} is"),
    ("state garbage", ["train", "--resume", "{run_garbage}"], 2, "not a readable training state"),
    ("state truncated", ["train", "--resume", "{run_trunc}"], 2, "not a readable training state"),
    ("[model] edited", ["train", "--resume", "{run_width}"], 2, "size mismatch"),
    # -- train --resume: a run directory's own files are inputs like any other -----------------
    *[
        (f"resume: {name} a FIFO", ["train", "--resume", "{run_fifo_" + key + "}"], 2, "is a FIFO")
        for name, key in RUN_FIFOS.items()
    ],
    ("resume: metrics torn", ["train", "--resume", "{run_torn_m}"], 2, "line 1 is cut short"),
    ("resume: ledger torn", ["train", "--resume", "{run_torn_l}"], 2, "ledger.jsonl: step 0's"),
    (
        "resume: a torn metrics line, extended",
        ["train", "--resume", "{run_torn_m}", "--set", "steps=4"],
        2,
        "metrics.jsonl: step 0's line is lost",
    ),
    (
        "resume: ledger out of order",
        ["train", "--resume", "{run_twice}"],
        2,
        "line 1: step 1 where",
    ),
    (
        "resume: a line cut mid-file",
        ["train", "--resume", "{run_cut_mid}"],
        2,
        "line 1: not a whole",
    ),
    (
        "resume: a planted episode",
        ["train", "--resume", "{run_planted}"],
        2,
        "g000002-r01.msgpack: not the episode this run plays as group 2 member 1 (its world_seed",
    ),
    (
        "resume: an episode of another version",
        ["train", "--resume", "{run_version}"],
        2,
        "(policy version 7, where the run plays it with version(s) [0])",
    ),
    # -- replay: a commons version the record does not hold ------------------------------------
    ("commons version 999", ["replay", "{commons_999}"], 2, "says version 999, but the episode"),
    ("commons version -5", ["replay", "{commons_-5}"], 2, "says version -5, but the episode"),
    ("commons version 2^63+5", ["replay", "{commons_big}"], 2, f"says version {2**63 + 5}, but"),
    ("commons as recorded", ["replay", "{commons_ok}"], 0, '"replay": "identical"'),
    (
        "commons 2^70 in a run",
        ["run", "library", "--param", 'library={{"version": ' + str(2**70) + "}}"],
        2,
        "integers must be within -2**63..2**64-1",
    ),
    (
        "commons 999 in a run",
        ["run", "library", "--param", 'library={{"version": 999}}'],
        2,
        "not pinned",
    ),
    # -- replay: a policy that cannot be reached is bad input, not a divergence ----------------
    (
        "replay: sglang not there",
        ["replay", "{episode}", "--policy", "sglang:http://127.0.0.1:9"],
        2,
        "SGLang server http://127.0.0.1:9 cannot be reached",
    ),
    # -- experiment: the command line's rules -------------------------------------------------
    *[
        (
            f"experiment {' '.join(args)}",
            ["experiment", "signs-of-life", *args, "--out", "{tmp}/sol"],
            2,
            frag,
        )
        for args, frag in EXPERIMENT
    ],
    # -- a world file that raises KeyboardInterrupt at import: its error, not a Ctrl-C -------
    ("world file KeyboardInterrupt", ["run", "{ki}:W"], 2, "ki.py failed: KeyboardInterrupt"),
    # -- numbers: one syntax for every flag and --param ----------------------------------------
    *[
        (f"number {flag} {text!r}", [*cmd, flag, text], 2, frag)
        for cmd, flag, text, frag in NUMBERS
    ],
    # -- errors from other libraries, as one line ---------------------------------------------
    ("hf:DIR weights torn", ["run", "tally", "--policy", "hf:{model_torn}"], 2, "SafetensorError"),
    (
        "hf:DIR weights garbage",
        ["run", "tally", "--policy", "hf:{model_junk}"],
        2,
        "cannot be read",
    ),
    (
        "hf_model weights torn",
        [*TRAIN, "--set", 'backend="hf"', "--set", "hf_model={model_torn}"],
        2,
        "its weights cannot be read (truncated or corrupt?): SafetensorError",
    ),
    (  # the model loads, then the server is not there: the error is the only line
        "hf_model loads, its server is not there",
        [*TRAIN, "--set", 'backend="hf"', "--set", "hf_model={model_ok}", "--set", HF_SERVER_9],
        2,
        "SGLang server http://127.0.0.1:9 cannot be reached",
    ),
    (
        "commons 2^70 with --out",
        [
            "run",
            "library",
            "--param",
            'library={{"version": ' + str(2**70) + "}}",
            "--out",
            "{tmp}/c.msgpack",
        ],
        2,
        "integers must be within -2**63..2**64-1",
    ),
    # -- limits as totals and combinations -----------------------------------------------------
    ("weights sum to inf", ["train", "{mix_inf}", "--out", "{newrun}"], 2, "weights sum to inf"),
    (
        "baselines 10^9 a world",
        ["train", "{mix_big}", "--out", "{newrun}"],
        2,
        "baselines: 2,000,000,000 episodes kept (1,000,000,000 a world) need at least",
    ),
    (
        "world beside [[worlds]], at its default",
        ["train", "{mix_world}", "--out", "{newrun}"],
        2,
        "[[worlds]] replaces world (each world has its own)",
    ),
    (
        "--set world beside [[worlds]]",
        ["train", "{mix_ok}", "--out", "{newrun}", "--set", "world=workshop"],
        2,
        "[[worlds]] replaces world",
    ),
    (
        "fork budget 10^9",
        [*TRAIN, "--set", "advantage=turn", "--set", "fork_samples=1000000000"],
        2,
        "2 x 1,000,000,000 = 2,000,000,000 forks a rollout (12,000,000,000 fork episodes a step",
    ),
    (
        "fork budget 1001",
        [*TRAIN, "--set", "advantage=turn", "--set", "fork_turns=1001", "--set", "fork_samples=1"],
        2,
        "at most 1,000 forks a rollout",
    ),
    # -- plot ----------------------------------------------------------------------------------
    ("plot nothing", ["plot", "{tmp}/none"], 2, "no metrics.jsonl"),
    ("plot over its metrics", ["plot", "{run_plotlink}"], 2, "is an input of this command"),
]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    tmp = tmp_path_factory.mktemp("bad")
    p: dict[str, Path] = {"tmp": tmp}
    os.mkfifo(tmp / "fifo")
    p["fifo"] = tmp / "fifo"
    (tmp / "dir").mkdir()
    (tmp / "dirlink").symlink_to(tmp / "dir")
    (tmp / "deadlink").symlink_to(tmp / "nothing")
    p["dirlink"], p["deadlink"] = tmp / "dirlink", tmp / "deadlink"
    p["file"] = tmp / "file.txt"
    p["file"].write_text("a file\n")
    p["text"] = tmp / "text.txt"
    p["text"].write_text("hello = [unclosed\n")
    p["garbage"] = tmp / "garbage.pt"
    p["garbage"].write_bytes(b"\x00garbage" * 50)
    p["small"] = tmp / "small.toml"
    p["small"].write_text(SMALL_TOML)
    p["newrun"] = tmp / "newrun"
    # Worlds whose class cannot even be defined: each in a file of its own.
    head = "from collective.world import World, tool\n\nclass {}(World):\n    @tool({})\n"
    p["prim"] = tmp / "prim.py"
    p["prim"].write_text(head.format("Prim", "") + "    def msg(self, agent): return ''\n")
    p["negdur"] = tmp / "negdur.py"
    p["negdur"].write_text(head.format("Slow", "duration=-5.0") + "    def go(self, agent): ...\n")
    # World files that end the import their own way.
    p["exits"] = tmp / "exits.py"
    p["exits"].write_text("import sys\n\nsys.exit(3)\n")
    p["base"] = tmp / "base.py"
    p["base"].write_text("raise BaseException('no')\n")
    p["ki"] = tmp / "ki.py"
    p["ki"].write_text("raise KeyboardInterrupt\n")
    # Mixes of worlds whose totals or combinations cannot be run.
    mix = "steps = 1\ngroups_per_step = 2\ngroup_size = 2\nplots = false\n"
    two = '[[worlds]]\nworld = "tally"\nname = "a"\n{}[[worlds]]\nworld = "tally"\nname = "b"\n{}'
    for name, text in (
        ("mix_ok", mix + two.format("", "")),
        ("mix_world", 'world = "workshop"\n' + mix + two.format("", "")),
        ("mix_inf", mix + two.format("weight = 1e308\n", "weight = 1e308\n")),
        ("mix_big", mix + "baseline_episodes = 1000000000\n" + two.format("", "")),
    ):
        p[name] = tmp / f"{name}.toml"
        p[name].write_text(text)
    # A small LM whose weights file is cut in half, and one whose weights are junk.
    p["model_ok"] = tmp / "model_ok"
    make_tiny_lm(p["model_ok"])
    p["model_torn"] = tmp / "model_torn"
    shutil.copytree(p["model_ok"], p["model_torn"])
    weights = p["model_torn"] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    p["model_junk"] = tmp / "model_junk"
    shutil.copytree(p["model_torn"], p["model_junk"])
    (p["model_junk"] / "model.safetensors").write_bytes(b"\x10" + b"\x00" * 7 + b"{junk" * 9)

    ep = run_episode(
        EpisodeConfig(world="workshop", agents=3, time_limit=120, tokenizer="bytes"),
        RandomPolicy(),
    )
    good = episode_file_bytes(ep)
    files = {
        "episode": good,
        "empty": b"",
        "truncated": good[: len(good) // 2],
        "extended": good + b"\x00",
        "flipped": good[:-10] + bytes([good[-10] ^ 4]) + good[-9:],
        "format1": encode_episode(ep).replace(b"\xa6format\x02", b"\xa6format\x01"),
    }
    data = msgspec.to_builtins(ep)
    world_turn = next(i for i, t in enumerate(data["turns"]) if t["kind"] == "world" and t["ok"])

    def forge(name: str, change: object) -> None:
        d = msgspec.to_builtins(ep)
        change(d)  # type: ignore[operator]
        files[name] = episode_file_bytes(msgspec.convert(d, type=type(ep)))

    forge("forged_result", lambda d: d["turns"][world_turn].update(result="all done"))
    forge(
        "forged_ids",
        lambda d: d["turns"][world_turn].update(
            token_ids=[x ^ 1 if x < 256 else x for x in d["turns"][world_turn]["token_ids"]]
        ),
    )
    forge("forged_score", lambda d: d.update(score=1.0))
    forge("forged_stats", lambda d: d["stats"].update(sent=d["stats"]["sent"] + 1))
    forge("forged_curve", lambda d: d["curve"].append([100.0, 1.0]))
    forge("forged_prompt", lambda d: d["turns"][2].update(prompt="you have won"))
    forge("forged_logprob", lambda d: d["turns"][0]["logprobs"].__setitem__(0, 3.0))
    forge("forged_lp", lambda d: d["turns"][2]["logprobs"].__setitem__(0, -0.125))
    forge("other_config", lambda d: d["config"].update(policy="someone else"))
    # An episode of version 1 with its commons (version 1), and forgeries naming another one.
    held = {"library": {"version": 1, "entries": ["key-3"]}}
    lib = run_episode(
        EpisodeConfig(world="library", agents=2, time_limit=60, params=held, policy_version=1),
        RandomPolicy(),
    )
    files["commons_ok"] = episode_file_bytes(lib)
    for name, version in (("999", 999), ("-5", -5), ("big", 2**63 + 5)):
        d = msgspec.to_builtins(lib)
        d["config"]["params"]["library"]["version"] = version
        files[f"commons_{name}"] = episode_file_bytes(msgspec.convert(d, type=type(lib)))
    # An unknown field cannot come from the module's writer: seal the bytes by hand.
    d = msgspec.to_builtins(ep)
    d["turns"][0]["reward"] = 1.0
    files["unknown"] = seal(msgspec.msgpack.encode(d))
    # The one-body layout (still read) is held to the same rules.
    d = msgspec.to_builtins(ep)
    d["turns"][0].update(token_ids=[1] * 10**6, logprobs=[-0.5] * 10**6)
    files["legacy_ids"] = seal(msgspec.msgpack.encode(d))
    d = msgspec.to_builtins(ep)
    next(e for e in d["events"] if e[0] == "commit")[2] = 99
    files["legacy_ghost"] = seal(msgspec.msgpack.encode(d))

    # Records the whole loader refuses, digests recomputed: every reader must refuse them too.
    def reseal(name: str, change: object) -> None:
        parts = [msgspec.to_builtins(part) for part in episode_parts(ep)]
        change(parts[1], parts[-1])  # type: ignore[operator]  (the one chunk, the closing)
        files[name] = seal_parts(parts)

    def event_of(chunk: list, tag: str) -> list:
        return next(e for e in chunk[1] if e[0] == tag)

    reseal("outcome_first", lambda c, _: c[2][0].update(kind="world", ok=True))
    reseal("ends_twice", lambda c, _: c[3].append(c[3][0]))
    reseal("end_index", lambda c, _: c[3][0].__setitem__(0, 10**6))
    reseal("ghost_commit", lambda c, _: event_of(c, "commit").__setitem__(2, 99))
    reseal("ghost_delivery", lambda c, _: event_of(c, "deliver").__setitem__(4, 99))
    reseal("counts", lambda _, close: close.__setitem__(6, close[6] + 1))
    reseal(
        "many_ids",
        lambda c, _: c[2][0].update(token_ids=[1] * 10**6, logprobs=[-0.5] * 10**6),
    )
    opening = [msgspec.to_builtins(part) for part in episode_parts(ep)]
    opening[0][1]["params"] = {"x": msgspec.Raw(b"\x91" * 1000 + b"\x00")}
    files["deep"] = seal_parts(opening)
    opening[0][1]["params"] = {"x": msgspec.Raw(b"\x91" * 40 + b"\x00")}
    files["deep40"] = seal_parts(opening)
    for name, blob in files.items():
        p[name] = tmp / f"{name}.msgpack"
        p[name].write_bytes(blob)
    p["eplink"] = tmp / "eplink.msgpack"
    p["eplink"].symlink_to(p["episode"])
    p["ephard"] = tmp / "ephard.msgpack"
    os.link(p["episode"], p["ephard"])
    p["worldcopy"] = tmp / "counter.py"  # a world file of its own: the table may not harm ours
    shutil.copy(HOSTILE, p["worldcopy"])
    (tmp / "loop1").symlink_to(tmp / "loop2")
    (tmp / "loop2").symlink_to(tmp / "loop1")
    p["loop"] = tmp / "loop1"

    p["unprompted"] = tmp / "unprompted.msgpack"
    quiet = EpisodeConfig(world="tally", agents=2, time_limit=30, keep_prompts=False)
    save_episode(run_episode(quiet, RandomPolicy()), p["unprompted"])

    # An episode of a world given by file path.
    p["foreign"] = tmp / "foreign.msgpack"
    foreign = EpisodeConfig(world=f"{HOSTILE}:Counter", time_limit=30)
    save_episode(run_episode(foreign, RandomPolicy()), p["foreign"])

    # A checkpoint 64 wide, and a finished one-step run with three broken copies.
    p["ckpt"] = save_checkpoint(TinyModel.fresh(TinyConfig(context=96)), tmp / "wide.pt")
    p["run"] = tmp / "run"  # steps = 2, stopped after one
    train(load_config(p["small"]), p["run"], progress=False, stop_after=1)
    p["run_linear"] = tmp / "run_linear"
    linear = ['time_limit="linear"', "time_limit_end=30.0", "steps=1"]
    train(load_config(p["small"], linear), p["run_linear"], progress=False)
    for kind in ("garbage", "trunc", "width"):
        copy = tmp / f"run_{kind}"
        shutil.copytree(p["run"], copy)
        state = copy / "checkpoints" / "train-state.pt"
        if kind == "garbage":
            state.write_bytes(b"junk\n")
        elif kind == "trunc":
            state.write_bytes(state.read_bytes()[:3000])
        else:  # [model] edited in a run from before config.json: the state does not fit
            cfg = copy / "config.toml"
            cfg.write_text(cfg.read_text().replace("d_model = 32", "d_model = 48"))
            (copy / "config.json").unlink()
        p[f"run_{kind}"] = copy

    # Damaged copies of the stopped run (checkpoint at step 1, metrics and ledger one line).
    def damaged(name: str, damage: Callable[[Path], object]) -> None:
        copy = tmp / f"run_{name}"
        shutil.copytree(p["run"], copy)
        damage(copy)
        p[f"run_{name}"] = copy

    for path, key in RUN_FIFOS.items():
        damaged(
            f"fifo_{key}", lambda r, f=path: (r / f).unlink(missing_ok=True) or os.mkfifo(r / f)
        )
    damaged(
        "torn_m",
        lambda r: (r / "metrics.jsonl").write_bytes((r / "metrics.jsonl").read_bytes()[:-9]),
    )
    damaged(
        "torn_l", lambda r: (r / "ledger.jsonl").write_bytes((r / "ledger.jsonl").read_bytes()[:-9])
    )
    damaged(
        "twice",
        lambda r: (r / "ledger.jsonl").write_text(
            (r / "ledger.jsonl").read_text().replace('"step":0', '"step":1')
        ),
    )
    damaged(
        "cut_mid",
        lambda r: (r / "metrics.jsonl").write_bytes(
            (r / "metrics.jsonl").read_bytes()[:40] + b"\n" + (r / "metrics.jsonl").read_bytes()
        ),
    )
    episodes = p["run"] / "episodes"
    damaged(
        "planted",
        lambda r: shutil.copy(episodes / "g000000-r01.msgpack", r / "episodes/g000002-r01.msgpack"),
    )
    later = load_episode(episodes / "g000000-r00.msgpack")
    later = msgspec.structs.replace(
        later, config=msgspec.structs.replace(later.config, policy_version=7)
    )
    damaged("version", lambda r: save_episode(later, r / "episodes/g000002-r00.msgpack"))
    # A run whose plots/returns.png links to its own metrics: plot must not write through it.
    p["run_plotlink"] = tmp / "run_plotlink"
    shutil.copytree(p["run"], p["run_plotlink"])
    (p["run_plotlink"] / "plots").mkdir(exist_ok=True)
    (p["run_plotlink"] / "plots" / "returns.png").symlink_to(p["run_plotlink"] / "metrics.jsonl")
    p["run_edited"] = tmp / "run_edited"
    shutil.copytree(p["run"], p["run_edited"])
    edited = p["run_edited"] / "config.toml"
    text = edited.read_text().replace("\nseed = 0\n", "\nseed = 3\n")
    edited.write_text(text.replace("learning_rate = 0.003", "learning_rate = 0.01"))
    # Run directories another training holds: a new one, and a run to resume.
    p["held"] = tmp / "held"
    p["run_held"] = tmp / "run_held"
    shutil.copytree(p["run"], p["run_held"])
    with contextlib.ExitStack() as held:
        held.enter_context(RunDir(p["held"], load_config(p["small"])).lock(resume=False))
        resumed = load_config(p["run_held"] / "config.toml")
        held.enter_context(RunDir(p["run_held"], resumed).lock(resume=True))
        yield {**{k: str(v) for k, v in p.items()}, "pid": str(os.getpid())}


@pytest.mark.parametrize(
    ("argv", "code", "fragment"),
    [pytest.param(argv, code, frag, id=name) for name, argv, code, frag in CASES],
)
def test_bad_input(
    argv: list[str],
    code: int,
    fragment: str,
    env: dict[str, str],
    capfd: pytest.CaptureFixture[str],
) -> None:
    args = [a.format(**env) for a in argv]
    fragment = fragment.format(**env)
    newrun = Path(env["newrun"])
    shutil.rmtree(newrun, ignore_errors=True)
    try:
        got = main(args)
    except SystemExit as e:  # argparse's own refusals (a bad choice or number)
        got = e.code
    out, err = capfd.readouterr()  # (file descriptors: an experiment runs in a process of its own)
    assert got == code, f"exit {got}, wanted {code}\nstdout: {out[-800:]}\nstderr: {err[-800:]}"
    assert fragment in (err if code == 2 else out), (out, err)
    assert "Traceback" not in out + err
    if code == 2:
        assert err.count("\n") == 1, f"not one line: {err!r}"
        assert not newrun.exists(), "a failed start left a run directory behind"


# Sizes the memory guard once let through and then could not finish (issue 26): each refused in
# one line, before any work, by a real `collective` process given 8 GiB of address space, which
# the guard reads as the memory there is (so the rows hold on any machine that runs the suite).
TOO_BIG: list[tuple[str, list[str], str]] = [
    (
        "2.5M agents",
        ["run", "workshop", "--agents", "2500000", "--time-limit", "3"],
        "2,500,000 agents need at least",
    ),
    ("10^7 modules an agent", ["run", "workshop", "--param", "size=10000000"], "the world needs"),
    (
        "10^6 a group and in flight",
        [*TRAIN, "--set", "group_size=1000000", "--set", "concurrency=1000000"],
        "need at least",
    ),
    (
        "10^6 a group",
        [*TRAIN, "--set", "group_size=1000000"],
        "held for the learner need at least",
    ),
]


@pytest.mark.parametrize(
    ("argv", "fragment"), [pytest.param(argv, frag, id=name) for name, argv, frag in TOO_BIG]
)
def test_sizes_that_cannot_fit_are_refused_before_any_work(
    argv: list[str], fragment: str, env: dict[str, str]
) -> None:
    import resource

    def eight_gib() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, resource.RLIM_INFINITY))

    newrun = Path(env["newrun"])
    shutil.rmtree(newrun, ignore_errors=True)
    t0 = time.monotonic()
    done = subprocess.run(
        [*CLI, *(a.format(**env) for a in argv)],
        capture_output=True,
        text=True,
        timeout=scaled(300),
        preexec_fn=eight_gib,
    )
    took = time.monotonic() - t0
    assert done.returncode == 2, done.stderr[-2000:]
    assert fragment in done.stderr and "more " in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert not newrun.exists(), "a refused start left a run directory behind"
    assert took < 60, f"{took:.0f} s: it did work before refusing"  # seconds: the imports


def test_every_case_is_its_own() -> None:
    assert len({c[0] for c in CASES}) == len({tuple(c[1]) for c in CASES}) == len(CASES)


def test_nothing_in_the_table_was_replaced_or_left_behind(env: dict[str, str]) -> None:
    assert Path("/dev/full").is_char_device() and Path("/dev/null").is_char_device()
    assert Path(env["fifo"]).is_fifo() and Path(env["dirlink"]).is_symlink()
    assert Path(env["file"]).read_text() == "a file\n"
    assert [p.name for p in Path(env["held"]).iterdir()] == ["lock"], "a held run was changed"
    leftovers = [p for p in Path(env["tmp"]).rglob(".*")]
    assert leftovers == [], leftovers


# -- what needs a real process ----------------------------------------------------------------


@pytest.mark.heavy
def test_ctrl_c_then_kill_9_during_training_and_the_run_resumes_as_if_never_stopped(
    tmp_path: Path,
) -> None:
    """Ctrl-C stops cleanly; the resumed run is killed with SIGKILL a step later; resumed again,
    it ends as the uninterrupted run does: the same metrics but wall-clock figures, the same
    episode files byte for byte. Every run under MKL's compatibility mode, where a float32
    product rounds a row differently by the rows beside it: the behaviour logprobs the episodes
    keep must not depend on how requests happened to be batched (``policy.tiny.invariant``)."""
    config = tmp_path / "small.toml"
    config.write_text(SMALL_TOML.replace("steps = 2", "steps = 8"))  # time to interrupt
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONHASHSEED": "0", "MKL_CBWR": "COMPATIBLE"}
    proc = subprocess.Popen(
        [*CLI_AT_A_TERMINAL, "train", str(config), "--out", str(run)],  # with its progress bar
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + scaled(120)
    while not (metrics.exists() and metrics.read_text().count("\n") >= 1):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=scaled(120))
    assert "rlcr: 100%" not in err, "the run ended before it could be interrupted"
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("collective train: interrupted at step ")
    assert last.endswith(f"resume with `collective train --resume {run}`")
    assert "rlcr:" not in last.split("\r")[-1], "the progress bar is cleared"
    step = int(last.split("interrupted at step ")[1].split(";")[0])
    assert 1 <= step < 7 and len(read_metrics(run)) == step  # steps left to kill the next in
    resumed = subprocess.Popen(
        [*CLI, "train", "--resume", str(run), "--quiet"], stdout=subprocess.DEVNULL, env=env
    )
    while metrics.read_text().count("\n") <= step:
        assert resumed.poll() is None and time.monotonic() < deadline + scaled(120), (
            "ended too soon"
        )
        time.sleep(0.05)
    resumed.kill()  # kill -9: no cleanup runs
    assert resumed.wait(scaled(30)) == -signal.SIGKILL
    assert step < len(read_metrics(run)) < 8
    done = subprocess.run(
        [*CLI, "train", "--resume", str(run), "--quiet"],
        capture_output=True,
        text=True,
        env=env,
        timeout=scaled(300),
    )
    assert done.returncode == 0, done.stderr
    whole = tmp_path / "whole"
    subprocess.run(
        [*CLI, "train", str(config), "--out", str(whole), "--quiet"],
        capture_output=True,
        env=env,
        timeout=scaled(300),
        check=True,
    )

    assert comparable_metrics(run) == comparable_metrics(whole), (
        "an interrupted run resumes as if never stopped"
    )
    names = sorted(p.name for p in (whole / "episodes").glob("*.msgpack"))
    for name in names:
        assert (run / "episodes" / name).read_bytes() == (whole / "episodes" / name).read_bytes()


@pytest.mark.slow
def test_ctrl_c_at_any_line_of_training_resumes_as_if_never_stopped(tmp_path: Path) -> None:
    """A real SIGINT at 60 lines spread over a 3-step training run, one run each, in a
    subprocess (``ctrl_c_everywhere.py train``): each interrupted run, resumed, ends as the
    uninterrupted one does. (About two minutes: ``pytest -m slow``; 300 lines were checked
    when training's trio.run was made to raise Ctrl-C only where its loop awaits.)"""
    config = tmp_path / "small.toml"
    config.write_text(SMALL_TOML.replace("steps = 2", "steps = 3"))
    report = ctrl_c_everywhere("train", "60", str(config), timeout=900)
    assert report.endswith("60 interrupted runs, 0 failed\n"), report


def test_training_without_matplotlib_skips_the_plots_with_a_note(tmp_path: Path) -> None:
    """A base install (no plots extra): the run finishes; the plots are skipped, saying how."""
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no matplotlib in a base install')\n")
    config = tmp_path / "small.toml"
    config.write_text(SMALL_TOML.replace("steps = 2", "steps = 1").replace("plots = false", ""))
    env = {**os.environ, "PYTHONPATH": f"{shadow.parent}{os.pathsep}{ROOT}"}
    done = subprocess.run(
        [*CLI, "train", str(config), "--out", str(tmp_path / "run"), "--quiet"],
        capture_output=True,
        text=True,
        env=env,
        timeout=scaled(300),
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["steps"] == 1
    assert done.stderr.count("\n") == 1 and "plots skipped" in done.stderr
    assert "collective[plots]" in done.stderr
    plot = subprocess.run(
        [*CLI, "plot", str(tmp_path / "run")], capture_output=True, text=True, env=env
    )
    assert plot.returncode == 2 and "needs matplotlib" in plot.stderr


def test_importing_the_package_configures_no_logging() -> None:
    code = (
        "import logging, structlog, collective, collective.rl.train; "
        "print(structlog.is_configured(), logging.getLogger().handlers)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False []", done.stdout + done.stderr
