"""Where a training run goes: this process, or a Ray actor on a node holding the learner's GPUs.

``train`` is the loop, run where it is called; ``launch`` is what the command line calls, and
decides the place from the config: with ``[cluster] backend = "ray"`` and ``learner_gpus > 0``
the whole loop runs in a :class:`collective.rl.cluster.LearnerHost` actor holding those GPUs
(the learner on its GPU, the run directory on its node, the rollout workers started from it),
which calls ``train`` itself; otherwise ``train`` runs here.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from collective.rl.cluster import LearnerDied, train_on_learner_node
from collective.rl.config import TrainConfig
from collective.rl.rundir import StepMetrics
from collective.rl.train import Interrupted, train


def on_learner_node(cfg: TrainConfig) -> bool:
    """Whether the config puts the loop in a Ray actor holding the learner's GPUs."""
    return cfg.cluster.backend == "ray" and cfg.cluster.learner_gpus > 0


def launch(
    cfg: TrainConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    stop_after: int | None = None,
) -> list[StepMetrics]:
    """``train(cfg, run_dir, ...)`` where the config places it (the module docstring), with
    ``train``'s contract either way: the metrics of the steps run now, and :class:`Interrupted`
    with the resume line when the run stops early (Ctrl-C, or the learner actor lost: the run
    stands at its last finished step)."""
    if not on_learner_node(cfg):
        return train(cfg, run_dir, resume=resume, progress=progress, stop_after=stop_after)
    try:
        where = str(Path(run_dir).absolute())  # (the actor's working directory is not ours)
        rows = train_on_learner_node(train, cfg, where, resume=resume, stop_after=stop_after)
    except (LearnerDied, KeyboardInterrupt) as e:
        why = str(e) if isinstance(e, LearnerDied) else "interrupted"
        raise Interrupted(f"{why}; resume with `collective train --resume {run_dir}`") from None
    return [msgspec.json.decode(r, type=StepMetrics) for r in rows]
