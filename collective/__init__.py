"""collective: an actor-model simulation engine for training agent collectives with RLCR.

Where things are: an agent's message goes through ``collective.episode`` (every effect lands
there); time moves only in ``collective.conductor``; the collective advantage is computed in
``collective.train``.
"""

from collective.actions import Action, ActionError, ActionSpace, ArgSpec, ToolSpec, parse_action
from collective.actor import Actor, Fired, default_program
from collective.conductor import Conductor, run_episode, run_episodes
from collective.organisation import Organisation, make_organisation, register_organisation
from collective.records import (
    Episode,
    EpisodeConfig,
    EpisodeFileError,
    EpisodeStream,
    EpisodeWriter,
    Turn,
    load_episode,
    open_episode,
    save_episode,
)
from collective.registry import resolve_world
from collective.swimlane import draw_timeline
from collective.trace import write_trace
from collective.world import OneOf, Range, Text, ToolError, World, tool

__all__ = [
    "Action",
    "ActionError",
    "ActionSpace",
    "Actor",
    "ArgSpec",
    "Conductor",
    "Episode",
    "EpisodeConfig",
    "EpisodeFileError",
    "EpisodeStream",
    "EpisodeWriter",
    "Fired",
    "OneOf",
    "Organisation",
    "Range",
    "Text",
    "ToolError",
    "ToolSpec",
    "Turn",
    "World",
    "default_program",
    "draw_timeline",
    "load_episode",
    "make_organisation",
    "open_episode",
    "parse_action",
    "register_organisation",
    "resolve_world",
    "run_episode",
    "run_episodes",
    "save_episode",
    "tool",
    "write_trace",
]
