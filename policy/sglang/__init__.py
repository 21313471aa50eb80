"""The SGLang backend: one policy served by a fleet of SGLang servers over their HTTP API.

:mod:`.client` is the policy (a batch shared over the fleet, weight sync, followers) and builds
the one a spec names; :mod:`.spec` reads an ``sglang:URL[,URL...]`` or ``sglang:launch:MODEL_DIR``
spec, touching nothing; :mod:`.server` starts and stops a server of this program's own. The
client imports the other two; they import neither each other nor the client.
"""

from policy.sglang.client import MIN_SGLANG as MIN_SGLANG
from policy.sglang.client import SGLangPolicy as SGLangPolicy
from policy.sglang.client import by_head as by_head
from policy.sglang.client import policy_from_spec as policy_from_spec
from policy.sglang.client import split as split
from policy.sglang.server import SGLangServer as SGLangServer
from policy.sglang.server import free_port as free_port
from policy.sglang.server import sglang_command as sglang_command
from policy.sglang.spec import Constraint as Constraint
from policy.sglang.spec import SGLangSpec as SGLangSpec
from policy.sglang.spec import parse_spec as parse_spec
