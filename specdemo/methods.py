"""The registry of decoding methods: a name to the generator function that runs it.

Every entry takes (model, input_ids, *, max_new_tokens, sampling, eos_token_ids, stop, ...)
and yields the step events of `specdemo.events`; `method_options` loads what a method needs
beyond that (a draft, heads...) for a given target, once per process.
"""

import functools
from collections.abc import Callable
from types import MappingProxyType

from . import ar, cllm, jacobi, lookahead, medusa, speculative
from .draft import load_draft
from .errors import SpecDemoError
from .models import EMBEDDED, LoadedModel

METHODS: MappingProxyType[str, Callable] = MappingProxyType(
    {
        "ar": ar.generate,
        "speculative": speculative.generate,
        "medusa": medusa.generate,
        "lookahead": lookahead.generate,
        "jacobi": jacobi.generate,
        "cllm": cllm.generate,
    }
)


def get_method(name: str) -> Callable:
    """The generator function of method `name`; a SpecDemoError lists the known ones."""
    if name not in METHODS:
        raise SpecDemoError(f"unknown method {name!r}: choose one of {', '.join(METHODS)}")
    return METHODS[name]


@functools.cache
def method_options(name: str, target: LoadedModel) -> MappingProxyType:
    """The keyword arguments method `name` needs for `target` beyond the common ones."""
    get_method(name)
    if name == "speculative":
        if target.spec != EMBEDDED:
            raise SpecDemoError(f"speculative decoding of {target.spec} needs a draft of its vocabulary: pass draft=load_draft(...)")
        return MappingProxyType({"draft": load_draft(EMBEDDED, target)})
    if name == "medusa":
        if target.spec != EMBEDDED:
            raise SpecDemoError(f"Medusa decoding of {target.spec} needs heads trained for it: pass heads=medusa.load_heads(FOLDER, model)")
        return MappingProxyType({"heads": medusa.load_heads(medusa.EMBEDDED_HEADS, target.model)})
    if name == "cllm":
        if target.spec != EMBEDDED:
            raise SpecDemoError(
                f"CLLM decoding of {target.spec} needs a consistency-trained copy of it: pass "
                "cllm_model=cllm.load_cllm(SPEC, target), e.g. SPEC 'cllm/consistency-llm-7b-sharegpt48k' for its Vicuna-7B"
            )
        return MappingProxyType({"cllm_model": cllm.load_cllm(cllm.EMBEDDED_CLLM, target)})
    return MappingProxyType({})


def decoded_model(name: str, target: LoadedModel):
    """The weights method `name` decodes, whose greedy AR answer it must equal: the target's,
    except for a method that brings its own (cllm's consistency-trained copy)."""
    return method_options(name, target).get("cllm_model", target.model)
