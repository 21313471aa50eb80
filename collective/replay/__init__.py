"""Replay, fork and compare: any recorded episode re-run from its config and recorded answers.

Above the engine (it re-runs episodes through the conductor), below training and the views.
:mod:`.rerun` re-runs and checks; :mod:`.recorded` is the policy that answers from a record.
"""

from collective.replay.recorded import RecordedPolicy as RecordedPolicy
from collective.replay.rerun import (
    Divergence as Divergence,
)
from collective.replay.rerun import (
    audit as audit,
)
from collective.replay.rerun import (
    check_replayable as check_replayable,
)
from collective.replay.rerun import (
    compare as compare,
)
from collective.replay.rerun import (
    differences as differences,
)
from collective.replay.rerun import (
    first_divergence as first_divergence,
)
from collective.replay.rerun import (
    fork as fork,
)
from collective.replay.rerun import (
    prefix as prefix,
)
from collective.replay.rerun import (
    replay as replay,
)
from collective.replay.rerun import (
    tokenizer_of as tokenizer_of,
)
from collective.replay.rerun import (
    verify as verify,
)
