"""Resuming a study run by run: a finished result is re-used only when it was made exactly so.

A study (:mod:`experiments.signs_of_life`, :mod:`experiments.city`) is many training
runs and measurements, hours on 2 cores, and it must survive being stopped. Each result is keyed
by a *digest*: a BLAKE2b hash over everything it is a function of, written beside it.

- A training run's digest covers the full resolved :class:`TrainConfig` (every field it reads,
  defaults included, as ``msgspec`` encodes it; the turn-credit settings only where
  ``advantage = "turn"`` reads them), written to ``RUN/config.digest``. A run whose digest
  matches and that finished every step is re-used as it is; one that matches but stopped midway
  is resumed (``train(..., resume=True)``, what ``collective train --resume`` does), never
  restarted; one whose digest differs (or that has none and whose ``config.toml`` says another
  config) is never re-used: it is moved aside to ``RUN.stale-<digest>`` (nothing is deleted)
  and the run trained afresh.
- A measurement's digest covers the digest of the run it measures, the checkpoint's bytes
  (where it reads the trained weights), its own settings and the measuring code's version; it is
  stored beside the result (``NAME.digest.json``), and the result is re-used only when the
  digests are equal.

One mechanism for both, so "changed config, old result" cannot happen by a path forgotten.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from collective.rl.config import TrainConfig, flat_fields, load_config
from collective.rl.rundir import read_run_file
from collective.rl.train import read_metrics, train


def digest(*parts: Any) -> str:
    """A stable hash of ``parts`` (anything msgspec encodes; dict keys sorted)."""
    blob = msgspec.json.encode(msgspec.to_builtins(parts), order="sorted")
    return hashlib.blake2b(blob, digest_size=16).hexdigest()


def train_digest(cfg: TrainConfig) -> str:
    """The digest of a training run: its full resolved config in the flat form (``flat_fields``,
    whichever form it was written in), every field it reads (the turn-credit settings only under
    ``advantage = "turn"``; the mix's only with a mix), so a run made before those settings
    existed keeps its digest; ``role_policies`` and the commons' settings only when on;
    ``top_p`` only below 1)."""
    fields = flat_fields(cfg)
    if fields["top_p"] == 1.0:
        fields.pop("top_p")
    if not cfg.role_policies:
        fields.pop("role_policies")
    if cfg.commons.kind == "off":
        fields = {k: v for k, v in fields.items() if not k.startswith("commons")}
    if cfg.advantage.kind != "turn":
        fields = {k: v for k, v in fields.items() if not k.startswith("fork_")}
    if cfg.mix is None:
        fields = {k: v for k, v in fields.items() if k not in MIX_ONLY}
    if cfg.resample == 0:
        fields.pop("resample")
    if cfg.kl_coef == 0 or cfg.kl_estimator == "k3":
        fields.pop("kl_estimator")
    if cfg.init:  # the starting weights by their bytes, wherever the checkout puts them
        fields["init"] = file_digest(Path(cfg.init))
    return digest("train", fields)


#: The flat settings only a mix reads, out of the digest of a run that is none.
MIX_ONLY = ("world_normalise", "baseline_episodes", "worlds")


def file_digest(path: Path) -> str:
    return hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()


def run_digest(run: Path) -> str | None:
    """The digest a run directory was made with: ``config.digest`` if written, else (a run
    stopped before it was, or written before digests) that of its own ``config.toml``."""
    stamp = read_run_file(run / "config.digest")  # (a FIFO there: refused, never waited on)
    if stamp is not None:
        return stamp.decode(errors="replace").strip()
    if (run / "config.toml").is_file():
        try:
            return train_digest(load_config(run / "config.toml"))
        except ValueError:
            return None
    return None


def is_complete(run: Path, cfg: TrainConfig) -> bool:
    """Whether ``run`` finished ``cfg.steps`` steps and holds their weights."""
    # (a per-role run keeps a checkpoint a role: checkpoints/roles/ROLE/latest.pt; an hf run's
    # checkpoint is a model directory, checkpoints/latest/)
    latest = run / "checkpoints" / "latest"
    weights = (
        any((run / "checkpoints" / "roles").glob("*/latest.pt"))
        if cfg.role_policies
        else latest.with_suffix(".pt").is_file() or latest.is_dir()
    )
    return (run / "metrics.jsonl").is_file() and len(read_metrics(run)) >= cfg.steps and weights


def train_exact(cfg: TrainConfig, run: Path, log: Callable[[str], None] = print) -> str:
    """Train ``cfg`` into ``run``, re-using what is there only when its digest matches.
    Returns what happened: ``reused``, ``resumed``, ``trained`` or ``retrained`` (an old run
    of another config was moved aside first)."""
    want = train_digest(cfg)
    what = "trained"
    if run.exists() and any(run.iterdir()):
        have = run_digest(run)
        if have == want and is_complete(run, cfg):
            log(f"[{run.name}] reused (digest {want[:12]}: complete)")
            return "reused"
        if have == want and (run / "config.toml").is_file():
            log(f"[{run.name}] resuming (digest {want[:12]}: {len(read_metrics(run))} steps done)")
            train(cfg, run, resume=True, progress=False)
            (run / "config.digest").write_text(want + "\n")
            return "resumed"
        aside = run.with_name(f"{run.name}.stale-{(have or 'none')[:12]}")
        k = 1
        while aside.exists():  # an older copy of the same config kept aside: keep both
            aside, k = run.with_name(f"{run.name}.stale-{(have or 'none')[:12]}-{k}"), k + 1
        run.rename(aside)
        log(
            f"[{run.name}] config changed ({(have or 'none')[:12]} -> {want[:12]}): moved to "
            f"{aside.name}, training afresh"
        )
        what = "retrained"
    train(cfg, run, resume=False, progress=False)
    (run / "config.digest").write_text(want + "\n")
    return what


def cached(
    path: Path,
    key: str,
    settings: dict[str, Any],
    compute: Callable[[], Any],
    save: Callable[[Path, Any], None],
    load: Callable[[Path], Any],
) -> tuple[Any, bool]:
    """The result at ``path`` if its stored digest is ``key``; else ``compute()``, saved (the
    result first, then its digest, each written whole: a stop between them leaves a result
    with no digest, which is measured again). Returns (result, re-used)."""
    stamp = path.with_name(path.name + ".digest.json")
    if path.is_file() and stamp.is_file():
        try:
            if json.loads(stamp.read_text()).get("digest") == key:
                return load(path), True
        except json.JSONDecodeError:
            pass
    result = compute()
    store(path, key, settings, result, save)
    return result, False


def store(
    path: Path, key: str, settings: dict[str, Any], result: Any, save: Callable[[Path, Any], None]
) -> None:
    """Write a result and, after it, its digest (with the settings it stands for, readable)."""
    stamp = path.with_name(path.name + ".digest.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{path.suffix}")
    save(tmp, result)
    tmp.replace(path)
    stamp.write_text(json.dumps({"digest": key, "settings": settings}, indent=1, default=str))


def stored_digest(path: Path) -> str | None:
    stamp = path.with_name(path.name + ".digest.json")
    try:
        return json.loads(stamp.read_text()).get("digest") if path.is_file() else None
    except (OSError, json.JSONDecodeError):
        return None
