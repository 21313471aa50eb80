"""The SGLang backend: one policy served by a fleet of SGLang servers over their HTTP API.

:mod:`.client` is the fleet (a batch shared over the servers, lost servers, followers, the pause
and check around a weight update) and builds the policy a spec names. What it stands on:
:mod:`.calls` makes one HTTP call with its retries; :mod:`.health` checks once that every server
is up and honours seeds; :mod:`.shapes` writes a request's sampling parameters and reads an
answer; :mod:`.sync` picks the :class:`~policy.sglang.sinks.WeightSink` of each update
(:mod:`.sinks.disk`, :mod:`.sinks.tensor`, :mod:`.sinks.distributed`, over the byte layouts of
:mod:`.weights`) and holds the gate between updates and batches; :mod:`.spec` reads an
``sglang:URL[,URL...]`` or ``sglang:launch:MODEL_DIR`` spec, touching nothing; :mod:`.server`
starts and stops a server of this program's own. Imports run one way: client over sync and
health over the sinks over calls, spec and server; none of them imports the client.
"""

from policy.sglang.client import MIN_SGLANG as MIN_SGLANG
from policy.sglang.client import SGLangPolicy as SGLangPolicy
from policy.sglang.client import by_head as by_head
from policy.sglang.client import policy_from_spec as policy_from_spec
from policy.sglang.client import split as split
from policy.sglang.server import SGLangServer as SGLangServer
from policy.sglang.server import free_port as free_port
from policy.sglang.server import sglang_command as sglang_command
from policy.sglang.sinks import WeightSink as WeightSink
from policy.sglang.spec import Constraint as Constraint
from policy.sglang.spec import SGLangSpec as SGLangSpec
from policy.sglang.spec import parse_spec as parse_spec
