"""The ground floor: plain data and helpers every layer shares, importing nothing of ours.

Actions and their spaces, seeded random streams, the latency model, the communication
primitives, logging and the one way files are written and read. ``policy/`` may import these
and nothing else of ``collective`` (``tests/project/test_import_graph.py`` holds that).
"""

from collective.base.actions import (
    Action as Action,
)
from collective.base.actions import (
    ActionError as ActionError,
)
from collective.base.actions import (
    ActionSpace as ActionSpace,
)
from collective.base.actions import (
    ArgSpec as ArgSpec,
)
from collective.base.actions import (
    ToolSpec as ToolSpec,
)
from collective.base.actions import (
    parse_action as parse_action,
)
from collective.base.latency import LatencyModel as LatencyModel
from collective.base.latency import latency_preset as latency_preset
from collective.base.outputs import InputError as InputError
from collective.base.outputs import OutputError as OutputError
from collective.base.primitives import PRIMITIVES as PRIMITIVES
from collective.base.primitives import Primitive as Primitive
from collective.base.seeding import Stream as Stream
from collective.base.seeding import derive as derive
