"""A training run in TensorBoard or Weights & Biases (``--set logger=tensorboard`` / ``wandb``).

``metrics.jsonl`` stays the run's record; a logger is a second copy of it for the tools people
already watch runs in. Every field of every step's metrics line is written at that step (nested
dicts flattened: ``useful_rel/solo``), together with the run's config as hyperparameters and the
time-limit schedule. Both are optional extras (``pip install -e .[loggers]``); asking for one
that is not installed is an error before training starts.

Resuming: a logger writes only the steps run now, so nothing is written twice. TensorBoard is
told the step the run resumes from (``purge_step``): a step that was logged but not
checkpointed before a crash is run again, and TensorBoard hides the first copy. A W&B run keeps
its id in the run directory and resumes the same run; W&B is offline (files under
``RUN/wandb``, uploaded later with ``wandb sync``) unless ``WANDB_MODE`` says otherwise or the
user has logged in (``WANDB_API_KEY`` or ``wandb login``).
"""

from __future__ import annotations

import importlib
import netrc
import os
import secrets
from pathlib import Path
from typing import Any, Protocol

import msgspec

LOGGERS = ("none", "tensorboard", "wandb")
_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}


class RunLogger(Protocol):
    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """One line of metrics.jsonl, as a dict."""
        ...

    def close(self) -> None: ...


def check_logger(kind: str) -> None:
    """Fail before training starts if the logger's package is missing."""
    package = _PACKAGES.get(kind)
    if package is None:
        return
    try:
        importlib.import_module(package)
    except ImportError:
        raise ValueError(
            f"logger={kind} needs the {package} package: pip install -e '.[loggers]' "
            f"(or pip install {package})"
        ) from None


def flatten(value: Any, prefix: str = "") -> dict[str, float]:
    """Numbers of a (nested) metrics dict as ``a/b`` keys; booleans become 0/1."""
    out: dict[str, float] = {}
    if isinstance(value, dict):
        for key, v in value.items():
            out.update(flatten(v, f"{prefix}{key}/" if isinstance(v, dict) else f"{prefix}{key}"))
    elif isinstance(value, bool | int | float):
        out[prefix.rstrip("/")] = float(value)
    return out


def hyperparameters(config: Any) -> dict[str, Any]:
    """The config as flat hyperparameters: scalars as they are, lists and tuples as text."""
    out: dict[str, Any] = {}

    def walk(value: Any, key: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{key}/{k}" if key else str(k))
        elif isinstance(value, bool | int | float | str):
            out[key] = value
        else:
            out[key] = ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)

    walk(msgspec.to_builtins(config), "")
    return out


def open_logger(
    kind: str, config: Any, run_dir: Path, first_step: int, schedule: list[float]
) -> RunLogger | None:
    """The logger a run asked for (None for ``none``), ready to take steps from ``first_step``.

    ``schedule``: the time limit T_max of every step of the run."""
    check_logger(kind)
    if kind == "tensorboard":
        return TensorBoardLogger(config, run_dir / "tensorboard", first_step, schedule)
    if kind == "wandb":
        return WandbLogger(config, run_dir, first_step, schedule)
    return None


class TensorBoardLogger:
    """Event files under ``RUN/tensorboard``: scalars per step, hyperparameters, the config."""

    def __init__(self, config: Any, logdir: Path, first_step: int, schedule: list[float]) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        # purge_step: events at or after the step the run resumes from are superseded.
        self.writer = SummaryWriter(str(logdir), purge_step=first_step if first_step else None)
        if first_step == 0:
            params = hyperparameters(config)
            file_writer = self.writer.file_writer
            assert file_writer is not None  # (SummaryWriter makes it in its constructor)
            for summary in hparams(params, {"return_mean": 0.0, "score_mean": 0.0}):
                file_writer.add_summary(summary)
            text = "\n".join(f"    {k} = {v!r}" for k, v in params.items())
            self.writer.add_text("config", text, 0)
        for step in range(first_step, len(schedule)):
            self.writer.add_scalar("schedule/time_limit", schedule[step], step)
        self.writer.flush()

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        for key, value in flatten(metrics).items():
            if key != "step":
                self.writer.add_scalar(key, value, step)
        self.writer.flush()  # a step is minutes of work: let a watching TensorBoard see it now

    def close(self) -> None:
        self.writer.close()


def wandb_mode() -> str:
    """``WANDB_MODE`` if set; else online for a user who logged in, offline for anyone else."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("//")[-1]
        logged_in = netrc.netrc().authenticators(host.rstrip("/")) is not None
    except (OSError, netrc.NetrcParseError):
        logged_in = False
    return "online" if logged_in else "offline"


class WandbLogger:
    """A W&B run in ``RUN/wandb``; its id is kept in ``RUN/wandb-run-id`` for resuming."""

    def __init__(self, config: Any, run_dir: Path, first_step: int, schedule: list[float]) -> None:
        import wandb

        from collective.rl.rundir import read_run_file

        id_file = run_dir / "wandb-run-id"
        if (kept := read_run_file(id_file)) is not None:  # (a FIFO there: refused)
            run_id = kept.decode(errors="replace").strip()
        else:
            run_id = secrets.token_hex(4)  # W&B ids: lowercase letters and digits
            id_file.write_text(run_id + "\n")
        hp = hyperparameters(config)
        hp["time_limit_schedule"] = schedule
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "collective"),
            name=run_dir.resolve().name,
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            config=hp,
            mode=wandb_mode(),  # type: ignore[arg-type]
        )
        self.run.define_metric("*", step_metric="step")

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self.run.log({**flatten(metrics), "step": step})

    def close(self) -> None:
        import wandb

        self.run.finish()
        wandb.teardown()  # wait for W&B's writer process: the run file is complete when we return
