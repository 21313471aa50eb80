"""The config is a tree of tagged unions, and the flat form still reads into it.

Each file in ``configs/`` (written in the flat form) loads to the record it loaded to before the
tree (``tests/data/configs_flat_records.json``: ``config_fields`` and ``config_digest`` as the
flat ``TrainConfig`` of bf9cd51 gave them); a setting outside its branch is refused in one line;
``world`` beside ``[[worlds]]`` is refused even at its default; ``--set`` takes dotted paths and
flat names alike; and a run directory written by bf9cd51 (``tests/data/flat_run``: one step of a
tiny run) loads, keeps its digest and resumes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collective.rl.config import (
    UNIONS,
    CommonsCredit,
    Turn,
    config_digest,
    config_fields,
    dump_config,
    load_config,
    read_config,
)

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
CONFIGS = sorted((ROOT / "configs").glob("*.toml"))


def test_every_config_file_is_in_the_record() -> None:
    records = json.loads((DATA / "configs_flat_records.json").read_text())
    assert sorted(records) == [f"configs/{p.name}" for p in CONFIGS]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_each_config_file_loads_to_the_config_it_was(path: Path) -> None:
    before = json.loads((DATA / "configs_flat_records.json").read_text())[f"configs/{path.name}"]
    cfg = load_config(path)
    assert config_fields(cfg) == before["config"]
    assert config_digest(cfg) == before["digest"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_each_config_file_round_trips_through_the_tree_form(path: Path, tmp_path: Path) -> None:
    """``dump_config`` writes the tree form; read back, it is the same config and digest."""
    cfg = load_config(path)
    again = tmp_path / "config.toml"
    again.write_text(dump_config(cfg))
    text = again.read_text()
    assert "\nbackend =" not in text.split("[cluster]")[0] and "[advantage]" in text
    back = load_config(again)
    assert back == cfg and config_digest(back) == config_digest(cfg)


# (table, kind, a setting of another branch, a value away from its default)
FOREIGN = [
    ("advantage", "collective", "turns", 3),
    ("advantage", "individual", "horizon", 1.0),
    ("commons", "off", "size", 3),
    ("commons", "on", "reruns", 5),
    ("model", "tiny", "lora_rank", 4),
    ("model", "hf", "d_model", 48),
]


@settings(max_examples=40, deadline=None)
@given(case=st.sampled_from(FOREIGN), flat=st.booleans())
def test_a_setting_outside_its_branch_is_refused_in_one_line(
    case: tuple[str, str, str, object], flat: bool
) -> None:
    """Written in the tree (``[commons] kind = "off"`` with ``size``) or in the flat form
    (``commons = "off"`` with ``commons_size``), a setting the chosen branch does not read is
    refused, in one line naming the table, the kind and the setting."""
    table, kind, key, value = case
    if flat:
        from collective.rl.config import FLAT

        names = [f for f, p in FLAT.items() if p == (table, key)]
        if not names:  # (the tiny shape has no flat name: it is the [model] table)
            return
        raw: dict[str, object] = {
            {"model": "backend"}.get(table, table): kind,
            names[0]: value,
        }
    else:
        raw = {table: {"kind": kind, key: value}}
    with pytest.raises(ValueError) as e:
        read_config(raw)
    message = str(e.value)
    assert "\n" not in message and f"{table} = {kind!r} has no" in message, message
    assert key in message, message
    other = next(k for k, cls in UNIONS[table].items() if key in cls.__struct_fields__)
    assert read_config({table: {"kind": other, key: value}})  # (its own branch reads it)


def test_world_beside_worlds_is_refused_even_at_its_default(tmp_path: Path) -> None:
    """``world = "workshop"`` is the default, yet beside ``[[worlds]]`` it says something the
    mix does not do: refused as given, in one line."""
    path = tmp_path / "c.toml"
    path.write_text(
        'world = "workshop"\n\n[[worlds]]\nworld = "tally"\n\n[[worlds]]\nworld = "x"\n'
    )
    with pytest.raises(ValueError, match=r"\[\[worlds\]\] replaces world \(each world"):
        load_config(path)
    path.write_text('world = "workshop"\n\n[[worlds]]\nworld = "tally"\n')
    with pytest.raises(ValueError, match=r"\[\[worlds\]\] replaces world"):
        load_config(path)


def test_dotted_set_and_flat_names_agree(tmp_path: Path) -> None:
    base = ROOT / "configs" / "commons.toml"
    dotted = load_config(base, ["commons.size=4", "model.d_model=32", "advantage=turn"])
    flat = load_config(base, ["commons_size=4", 'advantage="turn"'])
    assert isinstance(dotted.commons, CommonsCredit) and dotted.commons.size == 4
    assert dotted.tiny.d_model == 32 and isinstance(dotted.advantage, Turn)
    assert msgspec.structs.replace(dotted, model=flat.model) == flat
    assert load_config(base, ["commons_size=5", "commons.size=4"]).commons.size == 4  # last wins
    with pytest.raises(ValueError, match="size must be >= 1"):
        load_config(base, ["commons.size=0"])
    assert load_config(base, ["commons.size=4", "commons_size=5"]).commons.size == 5
    assert load_config(base, ["advantage=turn", "advantage.turns=3"]).advantage == Turn(turns=3)
    assert load_config(base, ["world=tally"]).worlds[0].world == "tally"
    # the tree form takes the flat names too: the one world's settings, the hf ones
    tree = tmp_path / "tree.toml"
    tree.write_text(dump_config(load_config(base)))
    assert load_config(tree, ["team_sizes=[3]"]).worlds[0].team_sizes == (3,)
    hf = load_config(tree, ["backend=hf", "hf_model=m"])
    assert hf.hf.path == "m" and hf.commons == load_config(base).commons
    with pytest.raises(ValueError, match=r"commons = 'off' has no commons.size = 6"):
        load_config(tree, ["commons.kind=off"])


def test_a_bad_dotted_set_is_one_line(tmp_path: Path) -> None:
    base = ROOT / "configs" / "quick.toml"
    for item, says in (
        ("steps.x=1", "steps is not a table"),
        ("advantage.turns=0", "advantage = 'collective' has no advantage.turns = 0"),
        ("advantage=sideways", "sideways"),
        ("commons.size=4", "commons = 'off' has no commons.size = 4"),
    ):
        with pytest.raises(ValueError) as e:
            load_config(base, [item])
        assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_run_directory_of_the_flat_form_loads_keeps_its_digest_and_resumes(
    tmp_path: Path,
) -> None:
    """A run directory written at bf9cd51 (config.toml in the flat form, config.json with the
    digest of its flat record): its config loads to the digest it began with, and the run
    resumes, extended by a step, as ``collective train --resume --set steps=2`` does."""
    from collective.rl.train import read_metrics, train

    run = tmp_path / "run"
    shutil.copytree(DATA / "flat_run", run)
    began = json.loads((run / "config.json").read_text())
    cfg = load_config(run / "config.toml")
    assert config_digest(cfg) == began["digest"] and config_fields(cfg) == began["config"]
    train(load_config(run / "config.toml", ["steps=2"]), run, resume=True, progress=False)
    assert [m.step for m in read_metrics(run)] == [0, 1]
