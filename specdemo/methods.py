"""The registry of decoding methods: a name to the generator function that runs it.

Every entry takes (model, input_ids, *, max_new_tokens, sampling, eos_token_ids, stop, ...)
and yields the step events of `specdemo.events`; `method_options` loads what a method needs
beyond that (a draft, heads...) for a given target, once per process.
"""

import functools
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType

from . import ar, beam, cllm, contrastive, jacobi, lookahead, medusa, speculative
from .draft import Draft, load_draft
from .eagle import load_feature_draft
from .errors import SpecDemoError
from .models import LoadedModel
from .presets import preset_for

METHODS: MappingProxyType[str, Callable] = MappingProxyType(
    {
        "ar": ar.generate,
        "speculative": speculative.generate,
        "medusa": medusa.generate,
        "lookahead": lookahead.generate,
        "jacobi": jacobi.generate,
        "cllm": cllm.generate,
        "beam": beam.generate,
        "contrastive": contrastive.generate,
    }
)


# methods that look for another answer than greedy AR's, on purpose: equality with AR is not expected
OTHER_ANSWER = MappingProxyType({
    "beam": "not expected: beam search keeps k answers and may find a likelier one than greedy",
    "contrastive": "not expected: contrastive decoding rescores tokens against the amateur",
})


def get_method(name: str) -> Callable:
    """The generator function of method `name`; a SpecDemoError lists the known ones."""
    if name not in METHODS:
        raise SpecDemoError(f"unknown method {name!r}: choose one of {', '.join(METHODS)}")
    return METHODS[name]


@functools.cache
def method_options(name: str, target: LoadedModel) -> MappingProxyType:
    """The keyword arguments method `name` needs for `target` beyond the common ones, loaded from
    the companions its preset names (`specdemo.presets`)."""
    get_method(name)
    if name == "speculative":  # the feature draft where the preset has one, as it drafts better
        feature_draft = getattr(preset_for(target.spec), "feature_draft", None)
        if feature_draft is not None:
            return MappingProxyType({"draft": load_feature_draft(Path(feature_draft), target.model)})
        return MappingProxyType({"draft": token_draft(target)})
    if name == "medusa":
        heads = medusa.load_heads(companion(target, "medusa_heads"), target.model)
        preset = preset_for(target.spec)
        if heads.choices is None and preset.medusa_tree:  # published heads bring no tree: the preset's is their default
            heads.choices = [list(path) for path in preset.medusa_tree]
        return MappingProxyType({"heads": heads})
    if name == "cllm":
        return MappingProxyType({"cllm_model": cllm.load_cllm(companion(target, "cllm"), target)})
    if name == "contrastive":  # the amateur is the token draft: a small LM of its own, which a feature draft is not
        return MappingProxyType({"amateur": token_draft(target).model})
    return MappingProxyType({})


@functools.cache
def token_draft(target: LoadedModel) -> Draft:
    """The target's draft model (a small causal LM of its vocabulary), loaded once: speculative
    decoding's draft where there is no feature draft, transformers' assistant, contrastive's amateur."""
    return load_draft(companion(target, "draft"), target)


MISSING_COMPANION = {
    "draft": "speculative decoding of {target} needs a draft with its vocabulary, and no preset names one: "
    "pass draft=load_draft(SPEC, target) with a small model of its family",
    "medusa_heads": "Medusa decoding of {target} needs heads trained for it, and no preset names any: "
    "pass heads=medusa.load_heads(FOLDER_OR_HUB_ID, model)",
    "cllm": "CLLM decoding of {target} needs a consistency-trained copy of it, and no preset names one: pass "
    "cllm_model=cllm.load_cllm(SPEC, target), e.g. SPEC 'cllm/consistency-llm-7b-sharegpt48k' for its ShareGPT Llama-7B",
}


def companion(target: LoadedModel, kind: str) -> str | Path:
    """The spec of `target`'s companion of `kind` ("draft", "medusa_heads" or "cllm"), from its preset."""
    preset = preset_for(target.spec)
    spec = getattr(preset, kind) if preset else None
    if spec is None:
        raise SpecDemoError(MISSING_COMPANION[kind].format(target=target.spec))
    return spec


def forget_companions() -> None:
    """Drop every loaded companion (drafts, heads, CLLMs), which hold their targets: after an
    evicted target (`ui.Targets`) nothing keeps it in memory. The others load again on first use."""
    method_options.cache_clear()
    token_draft.cache_clear()
    cllm.load_cllm.cache_clear()


def decoded_model(name: str, target: LoadedModel):
    """The weights method `name` decodes, whose greedy AR answer it must equal: the target's,
    except for a method that brings its own (cllm's consistency-trained copy)."""
    return method_options(name, target).get("cllm_model", target.model)
