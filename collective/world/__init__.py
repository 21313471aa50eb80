"""The world a researcher writes: a ``World`` subclass whose ``@tool`` methods are its actions.

This layer knows records, never the engine: a world is plain Python that the engine hosts
(``collective.engine.cast``), so it can be unit-tested with no episode running.
"""

from collective.world.world import (
    Commons as Commons,
)
from collective.world.world import (
    OneOf as OneOf,
)
from collective.world.world import (
    Range as Range,
)
from collective.world.world import (
    Scalar as Scalar,
)
from collective.world.world import (
    Text as Text,
)
from collective.world.world import (
    ToolError as ToolError,
)
from collective.world.world import (
    World as World,
)
from collective.world.world import (
    WorldBug as WorldBug,
)
from collective.world.world import (
    check_built as check_built,
)
from collective.world.world import (
    checked_observation as checked_observation,
)
from collective.world.world import (
    checked_score as checked_score,
)
from collective.world.world import (
    convert_params as convert_params,
)
from collective.world.world import (
    tool as tool,
)
