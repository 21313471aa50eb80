"""Runs in TensorBoard and W&B: every metric of metrics.jsonl at its step, read back with the
tools' own readers (TensorBoard's event accumulator; W&B's offline run file, record by record).
W&B runs offline here: no network is reached (the environment leaves no key and no login)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from torch.utils.tensorboard import SummaryWriter

from collective.cli import main
from collective.rl.loggers import flatten, wandb_mode
from collective.rl.train import time_limit_at, train
from tests.support import ROOT
from tests.support.training import small_train


def _rows(run: Path) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in flatten(r).items() if k != "step"} for r in rows]


def test_tensorboard_has_every_metric_the_schedule_and_the_config_across_a_resume(
    tmp_path: Path,
) -> None:
    cfg = small_train(steps=3, logger="tensorboard", time_limit="linear", time_limit_end=30.0)
    run = tmp_path / "run"
    train(cfg, run, progress=False, stop_after=2)
    # A crash after step 2 was logged but before it was checkpointed: the resumed run does
    # step 2 again, and TensorBoard must show only the new one.
    with SummaryWriter(str(run / "tensorboard")) as w:
        w.add_scalar("return_mean", 999.0, 2)
    train(cfg, run, resume=True, progress=False)

    ea = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    rows = _rows(run)
    assert len(rows) == 3 and "useful_rel/solo" in rows[0]  # nested dicts flattened
    for key in rows[0]:
        got = [(s.step, s.value) for s in ea.Scalars(key)]
        want = [(step, pytest.approx(r[key], rel=1e-6)) for step, r in enumerate(rows) if key in r]
        assert got == want, key
    schedule = [(s.step, s.value) for s in ea.Scalars("schedule/time_limit")]
    assert schedule == [(s, pytest.approx(time_limit_at(cfg, s))) for s in range(3)]
    content = ea.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hp = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hp["learning_rate"].number_value == pytest.approx(cfg.learning_rate)
    assert hp["world"].string_value == "tally" and hp["team_sizes"].string_value == "1,3"


def _wandb_records(path: Path) -> list[Any]:
    """The records of a W&B run file: a ':W&B' header, then LevelDB-log framing (32 KiB
    blocks; each chunk a 7-byte header: checksum, little-endian length, type) around protobuf
    ``Record`` messages."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending, out = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if left < 7 or kind == 0:  # the rest of a block is padding
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


@pytest.fixture
def offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No key, no login, no WANDB_MODE: the logger must choose offline by itself."""
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc from a `wandb login`
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")


def test_wandb_offline_run_holds_every_metric_and_the_config(
    tmp_path: Path, offline_wandb: None
) -> None:
    assert wandb_mode() == "offline"
    run = tmp_path / "run"
    train(small_train(steps=2, logger="wandb"), run, progress=False)
    files = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1 and files[0].stem == "run-" + (run / "wandb-run-id").read_text().strip()
    records = _wandb_records(files[0])
    history = [
        {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    rows = _rows(run)
    assert [h["step"] for h in history] == [0, 1]
    for h, row in zip(history, rows, strict=True):
        assert {k: h[k] for k in row} == pytest.approx(row)
    (meta,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = {u.key: json.loads(u.value_json) for u in meta.config.update}
    assert config["learning_rate"] == pytest.approx(3e-3) and config["logger"] == "wandb"
    assert config["time_limit_schedule"] == [60.0, 60.0]


def test_wandb_is_online_only_for_a_user_who_logged_in(
    monkeypatch: pytest.MonkeyPatch, offline_wandb: None, tmp_path: Path
) -> None:
    assert wandb_mode() == "offline"
    (tmp_path / "home").mkdir()
    netrc = tmp_path / "home" / ".netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password k\n")
    netrc.chmod(0o600)
    assert wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() == "disabled"


def test_a_missing_logger_package_is_one_line_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if it were not installed
    out = tmp_path / "run"
    args = ["train", str(ROOT / "configs/quick.toml"), "--out", str(out), "--set", "logger=wandb"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "logger=wandb needs the wandb package" in err
    assert not out.exists()  # nothing started
    args[-1] = "logger=mlflow"
    assert main(args) == 2
    assert "logger" in capsys.readouterr().err
