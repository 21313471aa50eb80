"""Ways to look at an episode: the activity timeline, a Chrome/Perfetto trace, a swimlane
picture, one line of text an event. Views read records only; they never run an episode."""

from collective.views.swimlane import draw_timeline as draw_timeline
from collective.views.text import describe as describe
from collective.views.trace import write_trace as write_trace
