"""Open-ended hostile input, generated (hypothesis): a run directory damaged in every way a disk,
a kill or an adversary can leave it, against ``train --resume``; and numbers in every syntax,
against every numeric flag of every command and ``--param``.

A damaged run directory must end one of two ways: refused in one line naming the damaged file,
exit 2, with every byte of the directory as it was (no data is lost); or resumed to exactly the
uninterrupted run (what a kill leaves: a last line cut short of a step the resume redoes, a
line whole but for its newline). Never silently dropped records, never a hang, never a run
that trains on an episode it did not play.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collective.base import args as numbers
from collective.cli import build_parser, main
from collective.records import sealed_digest
from collective.rl.rundir import Ledger, RunDir, episode_key
from collective.rl.train import load_config, train
from tests.support.training import SMALL_TOML, comparable_metrics

# -- run-directory damage against --resume ----------------------------------------------------

#: The files a damaged copy may have cut: every record a resume reads.
CUTTABLE = ("metrics.jsonl", "ledger.jsonl", "config.json", "checkpoints/train-state.pt")
#: And those that may be replaced by a FIFO (present or not in the run).
FIFO_AT = (
    *CUTTABLE,
    "resumes.jsonl",
    "baselines.json",
    "wandb-run-id",
    "config.digest",
    "lock",
    "config.toml",
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A two-step run stopped after its first step (and the episodes finished by then), and
    the same run uninterrupted."""
    tmp = tmp_path_factory.mktemp("damage")
    config = tmp / "small.toml"
    config.write_text(SMALL_TOML)
    stopped, whole = tmp / "stopped", tmp / "whole"
    train(load_config(config), stopped, progress=False, stop_after=1)
    train(load_config(config), whole, progress=False)
    return {"stopped": stopped, "whole": whole}


def _tree(run: Path) -> dict[str, bytes | str]:
    """Every entry of a run directory but its lock (which a resume rewrites with its pid
    before it looks at the records): a regular file's bytes, anything else its kind."""
    out: dict[str, bytes | str] = {}
    for p in sorted(run.rglob("*")):
        name = str(p.relative_to(run))
        if name == "lock":
            continue
        if p.is_fifo():
            out[name] = "fifo"
        elif p.is_file():
            out[name] = p.read_bytes()
    return out


def _resume(run: Path) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(["train", "--resume", str(run), "--quiet"])
        except SystemExit as e:
            code = int(e.code or 0)
    return code, err.getvalue()


#: (what, damage(run) -> (the file a refusal names, whether the run must resume instead))
Damage = tuple[str, Callable[[Path], tuple[str, bool]]]


@st.composite
def damages(draw: st.DrawFn, episodes: list[str]) -> Damage:
    """A damage to a copy of the stopped run: what it is, and how to do it (returning the path,
    in the run, that a refusal must name, and whether the run must resume exactly instead)."""
    kind = draw(st.sampled_from(["cut", "fifo", "swap", "plant", "cut episode", "kill"]))
    later = [e for e in episodes if episode_key(e)[0] >= 2]  # (after the checkpoint's step)
    if kind == "cut":
        name = draw(st.sampled_from(CUTTABLE))
        frac = draw(st.floats(0, 1, exclude_max=True))
        newline_only = draw(st.booleans()) and name.endswith(".jsonl")

        def cut(run: Path) -> tuple[str, bool]:
            data = (run / name).read_bytes()
            keep = len(data) - 1 if newline_only else int(frac * len(data))
            (run / name).write_bytes(data[:keep])
            # A line that lost only its newline is whole: kept, and the run resumes.
            return name, name.endswith(".jsonl") and keep == len(data) - 1

        return (f"{name} cut ({'its newline' if newline_only else frac})", cut)
    if kind == "fifo":
        name = draw(st.sampled_from(FIFO_AT))

        def fifo(run: Path) -> tuple[str, bool]:
            (run / name).unlink(missing_ok=True)
            os.mkfifo(run / name)
            return name, False

        return (f"{name} a FIFO", fifo)
    if kind == "kill":  # a kill while step 1's lines were written: a cut last line, redone
        name = draw(st.sampled_from(["metrics.jsonl", "ledger.jsonl"]))
        size = draw(st.integers(1, 60))

        def killed(run: Path) -> tuple[str, bool]:
            line = (run / name).read_bytes().split(b"\n")[0].replace(b'"step":0', b'"step":1')
            with open(run / name, "ab") as f:
                f.write(line[:size])
            return name, True

        return (f"a kill mid-line in {name} ({size} bytes)", killed)
    source = draw(st.sampled_from([e for e in episodes if episode_key(e)[0] < 2]))
    target = draw(st.sampled_from([f"g00000{g}-r0{m}.msgpack" for g in (2, 3) for m in (0, 1, 2)]))
    if kind == "swap" and len(later) >= 2:
        a, b = draw(st.permutations(later))[:2]

        def swap(run: Path) -> tuple[str, bool]:
            ep = run / "episodes"
            (ep / a).rename(ep / "x")
            (ep / b).rename(ep / a)
            (ep / "x").rename(ep / b)
            return f"episodes/{min(a, b)}", False

        return (f"{a} and {b} swapped", swap)
    if kind == "cut episode" and later:
        victim = draw(st.sampled_from(later))
        frac = draw(st.floats(0.01, 0.99))

        def cut_episode(run: Path) -> tuple[str, bool]:
            p = run / "episodes" / victim
            p.write_bytes(p.read_bytes()[: int(frac * p.stat().st_size)])
            return f"episodes/{victim}", False

        return (f"{victim} cut", cut_episode)

    def plant(run: Path) -> tuple[str, bool]:  # a sealed episode of an earlier group, later
        shutil.copy(run / "episodes" / source, run / "episodes" / target)
        return f"episodes/{target}", False

    return (f"{source} planted as {target}", plant)


def test_a_damaged_run_directory_is_refused_naming_the_file_or_resumes_exactly(
    runs: dict[str, Path],
) -> None:
    episodes = sorted(p.name for p in (runs["stopped"] / "episodes").iterdir())
    whole = comparable_metrics(runs["whole"])
    whole_ledger = (runs["whole"] / "ledger.jsonl").read_bytes()

    outcomes: set[str] = set()

    # (derandomized: the same damages every run, so the suite's time and its coverage of both
    # outcomes, checked below, do not depend on a draw)
    @settings(max_examples=24, deadline=None, database=None, derandomize=True)
    @given(damage=damages(episodes))
    def check(damage: Damage) -> None:
        what, harm = damage
        with tempfile.TemporaryDirectory() as tmp:
            run = Path(tmp) / "run"
            shutil.copytree(runs["stopped"], run)
            named, resumes = harm(run)
            before = _tree(run)
            code, err = _resume(run)
            outcomes.add("resumed" if resumes else "refused")
            if resumes:
                assert code == 0, (what, err)
                assert comparable_metrics(run) == whole, what
                assert (run / "ledger.jsonl").read_bytes() == whole_ledger, what
                return
            assert code == 2, (what, code, err)
            assert err.count("\n") == 1 and "Traceback" not in err, (what, err)
            assert str(run / named) in err, (what, err)
            assert _tree(run) == before, f"{what}: a refused resume changed the run directory"

    check()
    assert {"resumed", "refused"} <= outcomes, outcomes


def test_the_ledger_binds_each_episode_file_and_a_swapped_one_is_refused(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """Every file a step used or dropped is named in its ledger line with the digest it is
    sealed with; a later reader of a learned-from file (a commons' credit reads its maker's
    turn back) gets it only while it is that file."""
    run = tmp_path / "run"
    shutil.copytree(runs["whole"], run)
    lines = [msgspec.json.decode(ln, type=Ledger) for ln in (run / "ledger.jsonl").open("rb")]
    for line in lines:
        assert sorted(line.digests) == sorted(line.used + line.dropped)
        for name, digest in line.digests.items():
            assert sealed_digest(run / "episodes" / name) == digest
    reader = RunDir(run, load_config(run / "config.toml"))
    assert reader.kept_episode(0, 1) is not None
    a, b = run / "episodes" / "g000000-r01.msgpack", run / "episodes" / "g000000-r02.msgpack"
    a.write_bytes(b.read_bytes())  # (sealed, whole: only the ledger can tell)
    with pytest.raises(ValueError, match=r"g000000-r01.msgpack: not the episode its step learned"):
        RunDir(run, load_config(run / "config.toml")).kept_episode(0, 1)


# -- numbers in every syntax against every numeric flag ----------------------------------------

#: The argparse types that read numbers (collective.base.args): every numeric flag uses one.
READERS = {
    numbers.whole,
    numbers.count,
    numbers.positive,
    numbers.real,
    numbers.wholes,
    numbers.reals,
}


def _numeric_flags() -> list[tuple[str, str, Callable[[str], object]]]:
    """(command, flag, its type) of every option of every command whose values are numbers."""
    out = []
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command, p in sub.choices.items():
        for action in p._actions:
            kind = action.type
            assert kind not in (int, float), f"{command} {action.option_strings}: type={kind}"
            if kind in READERS:
                out.append((command, action.option_strings[-1], kind))  # type: ignore[arg-type]
    return out


FLAGS = _numeric_flags()

#: Decimal digits of other scripts: Arabic-Indic, Devanagari, fullwidth, mathematical bold.
FOREIGN = ["\u0660", "\u0966", "\uff10", "\U0001d7ce"]


@st.composite
def number_texts(draw: st.DrawFn) -> str:
    """A number written in one of the ways a user, a script or an adversary writes one."""
    n = draw(st.one_of(st.integers(-(10**30), 10**30), st.floats(allow_nan=True)))
    text = repr(n) if isinstance(n, float) else str(n)
    form = draw(
        st.sampled_from(["plain", "spaces", "foreign", "underscore", "plus", "list", "hex", "junk"])
    )
    if form == "spaces":
        text = (
            draw(st.sampled_from([" ", "\t", "\u00a0"])) + text + draw(st.sampled_from(["", " "]))
        )
    elif form == "foreign":
        zero = ord(draw(st.sampled_from(FOREIGN)))
        text = "".join(chr(zero + int(c)) if c.isdigit() else c for c in text)
    elif form == "underscore" and len(text) > 2:
        text = text[:2] + "_" + text[2:]
    elif form == "plus" and not text.startswith("-"):
        text = "+" + text
    elif form == "list":
        text = draw(st.sampled_from([f"{text},,1", f"{text},", f",{text}", f"{text},2"]))
    elif form == "hex" and isinstance(n, int):
        text = hex(n)
    elif form == "junk":
        text = text + draw(st.sampled_from(["x", "e", ".", "..", "e+", "j"]))
    return text


_INT = re.compile(r"[+-]?[0-9]{1,100}")
_REAL = re.compile(
    r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)", re.I
)


def _expected(kind: Callable[[str], object], text: str) -> object | None:
    """What ``kind`` must read ``text`` as (None: refused), by the syntax the docs give."""
    one_int = bool(_INT.fullmatch(text))
    one_real = bool(_REAL.fullmatch(text))
    if kind is numbers.whole:
        return int(text) if one_int else None
    if kind is numbers.count:
        return int(text) if one_int and int(text) >= 0 else None
    if kind is numbers.positive:
        return int(text) if one_int and int(text) >= 1 else None
    if kind is numbers.real:
        return float(text) if one_real else None
    parts = text.split(",")
    pattern = _INT if kind is numbers.wholes else _REAL
    if not all(pattern.fullmatch(p) for p in parts):
        return None
    return tuple((int if kind is numbers.wholes else float)(p) for p in parts)


def _same(a: object, b: object) -> bool:
    return repr(a) == repr(b)  # (nan == nan, and 1 is not 1.0)


@settings(max_examples=400, deadline=None)
@given(text=number_texts(), flag=st.sampled_from(FLAGS))
def test_every_numeric_flag_reads_a_number_one_way(
    text: str, flag: tuple[str, str, Callable[[str], object]]
) -> None:
    command, name, kind = flag
    want = _expected(kind, text)
    try:
        got = kind(text)
    except argparse.ArgumentTypeError as e:
        assert want is None, f"{command} {name} {text!r}: refused ({e}), should read {want!r}"
        assert "\n" not in str(e), str(e)
        return
    assert want is not None and _same(got, want), f"{command} {name} {text!r} read as {got!r}"


@settings(max_examples=400, deadline=None)
@given(text=number_texts())
def test_a_param_reads_a_number_as_every_flag_does(text: str) -> None:
    """``--param k=TEXT``: a number a flag reads is that number (an integer's syntax an int);
    one a flag refuses for its spaces or its digits is refused too, never read as a string."""
    as_int, as_real = _expected(numbers.whole, text), _expected(numbers.real, text)
    try:
        got = numbers.param_value("k", text)
    except ValueError as e:
        assert as_real is None, f"{text!r}: refused ({e}), a flag reads {as_real!r}"
        return
    if as_int is not None:
        assert _same(got, as_int), (text, got)
    elif as_real is not None:
        assert _same(got, as_real), (text, got)
    else:
        assert text == text.strip(), f"{text!r}: spaces around it, read as {got!r}"
        assert not isinstance(got, int | float) or not any(
            c.isdigit() and not c.isascii() for c in text
        ), f"{text!r} read as the number {got!r}"


def test_every_command_with_numbers_is_covered() -> None:
    """The flags above are every command's (a command that gained a numeric flag with another
    reader fails ``_numeric_flags``)."""
    commands = {c for c, _, _ in FLAGS}
    assert {"run", "check", "replay", "show", "study", "make-model"} <= commands, commands
