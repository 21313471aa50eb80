"""The Hugging Face path: a local causal LM sampled in this process and trained by the learner.

:mod:`.prompt` turns a request into the token ids the model reads (the SGLang client sends the
same ids); :mod:`.grammar` compiles the action grammar to xgrammar token masks and holds the one
masked distribution sampled and scored; :mod:`.model` is the model as the learner trains it
(:class:`HFModel`: exact masked logprobs, chunked); :mod:`.policy` samples it in this process
(``--policy hf:DIR``); :mod:`.make` writes the ``tiny-lm`` model directory of ``collective
make-model`` and :mod:`.pretrained` its ``smollm2-135m``, from the GGUF of a registry wheel.
``prompt`` imports nothing of ours but ``collective.base``; the others build on it and on
``grammar`` in that order.
"""

from policy.hf.grammar import FORBIDDEN as FORBIDDEN
from policy.hf.grammar import ActionGrammar as ActionGrammar
from policy.hf.grammar import GrammarError as GrammarError
from policy.hf.grammar import masked_logits as masked_logits
from policy.hf.grammar import unpack as unpack
from policy.hf.make import CHAT_TEMPLATE as CHAT_TEMPLATE
from policy.hf.make import TinyLM as TinyLM
from policy.hf.make import check_empty as check_empty
from policy.hf.make import write_tiny_lm as write_tiny_lm
from policy.hf.model import DTYPES as DTYPES
from policy.hf.model import VERSION_FILE as VERSION_FILE
from policy.hf.model import HFModel as HFModel
from policy.hf.model import check_model_dir as check_model_dir
from policy.hf.model import placement as placement
from policy.hf.policy import HFPolicy as HFPolicy
from policy.hf.policy import load_hf_policy as load_hf_policy
from policy.hf.prompt import load_tokenizer as load_tokenizer
from policy.hf.prompt import prompt_ids as prompt_ids
from policy.hf.prompt import render as render
