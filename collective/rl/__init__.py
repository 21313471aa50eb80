"""Training: RLCR from collective rewards, top to bottom in :mod:`.train`.

One config type (:mod:`.config`), the run directory that survives a crash (:mod:`.rundir`),
rollouts (:mod:`.rollouts`, locally or on Ray through :mod:`.cluster`), the flat collective
advantage and its finer variants (:mod:`.train`, :mod:`.credit`), the learner
(:mod:`.learner`), policies for given weights (:mod:`.backend`), loggers and plots.
"""

from collective.rl.config import TrainConfig as TrainConfig
from collective.rl.config import load_config as load_config
from collective.rl.rundir import RunDir as RunDir
from collective.rl.rundir import StepMetrics as StepMetrics
from collective.rl.train import train as train
