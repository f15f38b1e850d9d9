"""The registry of decoding methods: a name to the generator function that runs it.

Every entry takes (model, input_ids, *, max_new_tokens, sampling, eos_token_ids, stop, ...)
and yields the step events of `specdemo.events`.
"""

from collections.abc import Callable
from types import MappingProxyType

from . import ar
from .errors import SpecDemoError

METHODS: MappingProxyType[str, Callable] = MappingProxyType({"ar": ar.generate})


def get_method(name: str) -> Callable:
    """The generator function of method `name`; a SpecDemoError lists the known ones."""
    if name not in METHODS:
        raise SpecDemoError(f"unknown method {name!r}: choose one of {', '.join(METHODS)}")
    return METHODS[name]
