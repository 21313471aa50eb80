"""Records: what an episode is (:mod:`.schema`) and how it is kept on disk (:mod:`.fileformat`).

Everything that crosses a boundary is a typed ``msgspec.Struct``, validated once where it
enters. This layer imports nothing of the engine: a world, a learner or a viewer can read an
episode without running one. ``signs`` reads an episode in the units the findings are stated in.
"""

from collective.records.fileformat import (
    CHUNK_RECORDS as CHUNK_RECORDS,
)
from collective.records.fileformat import (
    HEADER_SIZE as HEADER_SIZE,
)
from collective.records.fileformat import (
    MAGIC as MAGIC,
)
from collective.records.fileformat import (
    Chunk as Chunk,
)
from collective.records.fileformat import (
    Closing as Closing,
)
from collective.records.fileformat import (
    EpisodeFileError as EpisodeFileError,
)
from collective.records.fileformat import (
    EpisodeStream as EpisodeStream,
)
from collective.records.fileformat import (
    EpisodeWriter as EpisodeWriter,
)
from collective.records.fileformat import (
    Opening as Opening,
)
from collective.records.fileformat import (
    Part as Part,
)
from collective.records.fileformat import (
    TurnEnd as TurnEnd,
)
from collective.records.fileformat import (
    TurnFinder as TurnFinder,
)
from collective.records.fileformat import (
    blank_turn as blank_turn,
)
from collective.records.fileformat import (
    decode_episode as decode_episode,
)
from collective.records.fileformat import (
    encode_episode as encode_episode,
)
from collective.records.fileformat import (
    episode_file_bytes as episode_file_bytes,
)
from collective.records.fileformat import (
    episode_parts as episode_parts,
)
from collective.records.fileformat import (
    load_episode as load_episode,
)
from collective.records.fileformat import (
    open_episode as open_episode,
)
from collective.records.fileformat import (
    save_episode as save_episode,
)
from collective.records.fileformat import (
    sealed_digest as sealed_digest,
)
from collective.records.fileformat import (
    world_error as world_error,
)
from collective.records.schema import (
    FORMAT as FORMAT,
)
from collective.records.schema import (
    AnyEvent as AnyEvent,
)
from collective.records.schema import (
    Asked as Asked,
)
from collective.records.schema import (
    Began as Began,
)
from collective.records.schema import (
    Committed as Committed,
)
from collective.records.schema import (
    Delivered as Delivered,
)
from collective.records.schema import (
    Dropped as Dropped,
)
from collective.records.schema import (
    Ended as Ended,
)
from collective.records.schema import (
    Episode as Episode,
)
from collective.records.schema import (
    EpisodeConfig as EpisodeConfig,
)
from collective.records.schema import (
    Event as Event,
)
from collective.records.schema import (
    Failed as Failed,
)
from collective.records.schema import (
    Fired as Fired,
)
from collective.records.schema import (
    Happened as Happened,
)
from collective.records.schema import (
    Hired as Hired,
)
from collective.records.schema import (
    Posted as Posted,
)
from collective.records.schema import (
    Rejected as Rejected,
)
from collective.records.schema import (
    Sent as Sent,
)
from collective.records.schema import (
    Spawned as Spawned,
)
from collective.records.schema import (
    Stats as Stats,
)
from collective.records.schema import (
    Thought as Thought,
)
from collective.records.schema import (
    Turn as Turn,
)
from collective.records.schema import (
    Woke as Woke,
)
from collective.records.schema import (
    failure_text as failure_text,
)
