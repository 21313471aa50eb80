"""The engine: where an agent's turn happens and where simulated time moves.

Read in this order: :mod:`.conductor` (the one loop that moves time and batches policy calls
at quiescence), :mod:`.agenda` (each episode's heap of ``(time, priority, id)``),
:mod:`.episode` (a live episode: an action lands, a message is delivered), :mod:`.recording`
(its record as it grows, sent in chunks), :mod:`.replayed` (what a replay feeds back instead
of measuring), :mod:`.actor` (an agent as a trio task, parked between turns), :mod:`.comms` (a
message's rules), :mod:`.cast` (who is in an episode), :mod:`.organisation` (who may hire whom),
:mod:`.quiescence`, :mod:`.registry` (worlds by name) and :mod:`.limits` (what fits in memory).
The engine imports records, worlds and the ground floor; nothing of training, replay, views or
studies.
"""

from collective.engine.actor import (
    Actor as Actor,
)
from collective.engine.actor import (
    Dismissed as Dismissed,
)
from collective.engine.actor import (
    EpisodeOver as EpisodeOver,
)
from collective.engine.actor import (
    default_program as default_program,
)
from collective.engine.cast import Cast as Cast
from collective.engine.comms import Comms as Comms
from collective.engine.comms import Outcome as Outcome
from collective.engine.conductor import (
    Conductor as Conductor,
)
from collective.engine.conductor import (
    run_episode as run_episode,
)
from collective.engine.conductor import (
    run_episodes as run_episodes,
)
from collective.engine.organisation import (
    Organisation as Organisation,
)
from collective.engine.organisation import (
    make_organisation as make_organisation,
)
from collective.engine.organisation import (
    register_organisation as register_organisation,
)
from collective.engine.registry import resolve_world as resolve_world
