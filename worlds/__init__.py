"""The built-in worlds, by name. Each is a short readable class; see docs/writing-a-world.md."""

BUILTIN: dict[str, str] = {
    "tally": "worlds.tally:Tally",
    "workshop": "worlds.workshop:Workshop",
    "relay": "worlds.relay:Relay",
    "market": "worlds.market:Market",
    "repo": "worlds.repo:Repo",
    "wildfire": "worlds.wildfire:Wildfire",
    "library": "worlds.library:Library",
}
