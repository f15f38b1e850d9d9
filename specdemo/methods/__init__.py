"""The registry of decoding methods: one `MethodSpec` a method, read by the app, the API, the bench and the docs.

A spec holds the method's generator function, what it accepts (sampling, logits processors, its
own settings, read from the function's signature), whether its answer must equal AR's, and its
descriptions. Every generator takes (model, input_ids, *, max_new_tokens, sampling,
eos_token_ids, stop, passes, ...) and yields the step events of `specdemo.core.events`; `passes` is
the target's compiled pass (`LoadedModel.passes`), None for the eager pass. `method_options`
loads what a method needs beyond that (a draft, heads... and, for a compiled target, their
compiled passes) for a given target, once, and holds it with the target (`LoadedModel.companions`).
Adding a method is one module and one entry here (docs/architecture.md).
"""

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from transformers import PreTrainedModel

from specdemo.core.errors import SpecDemoError
from specdemo.core.graphs import FunctionGraphs
from specdemo.core.static import DRAFT_BUCKETS, CompiledPass, compile_passes
from specdemo.methods import ar, beam, cllm, contrastive, jacobi, lookahead, medusa, speculative
from specdemo.methods.draft import Draft, load_draft
from specdemo.methods.eagle import load_feature_draft
from specdemo.methods.retrieval import load_datastore
from specdemo.models import LoadedModel
from specdemo.presets import preset_for

log = logging.getLogger(__name__)

COMMON = frozenset({"max_new_tokens", "sampling", "eos_token_ids", "stop"})  # what every method takes
# companions `method_options` loads, the target's compiled pass, and internals
LOADED = frozenset({"draft", "draft_passes", "heads", "heads_passes", "cllm_model", "cllm_passes", "amateur",
                    "datastore", "method_name", "passes"})


@dataclass(frozen=True)
class MethodSpec:
    """What the app, the API, the bench and the docs know of a method."""

    name: str
    generate: Callable  # (model, input_ids, *, max_new_tokens, sampling, eos_token_ids, stop, ...) -> events
    summary: str  # one line
    description: str  # a paragraph (Markdown): the page's "how it works"
    samples: bool = False  # takes sampling settings and keeps the target's distribution
    samples_when: str | None = None  # a yes/no setting that lets it sample without keeping the distribution
    processors: bool = True  # takes a repetition penalty and n-gram blocking, with the answer AR would give under them
    other_answer: str | None = None  # why its answer may differ from greedy AR's on purpose (None: it must not)
    controls: tuple[str, ...] = ()  # the settings the page has a control for (the others: library, API and bench only)
    # one sentence without jargon: the page's first words on the method (the description is its "details")
    plain: str = ""

    @property
    def settings(self) -> tuple[str, ...]:
        """Its own settings: the keyword arguments of `generate` beyond the common ones and the loaded companions."""
        return settings_of(self.generate)


def settings_of(function: Callable) -> tuple[str, ...]:
    parameters = inspect.signature(function).parameters.values()
    return tuple(p.name for p in parameters if p.kind is p.KEYWORD_ONLY and p.name not in COMMON | LOADED)


METHODS: MappingProxyType[str, MethodSpec] = MappingProxyType({
    "ar": MethodSpec(
        "ar", ar.generate, 'one target pass per token: the baseline every method is measured against',
        (
            '**Autoregressive decoding.** One target pass per token: x_t ~ p(x | x_<t). Every other method is measured '
            'against it.'
        ), samples=True,
        plain='The target, the model whose answer we want, runs one pass per token: each pass reads the text so far '
              'and adds one token. Every other method is measured against it.',
    ),
    "speculative": MethodSpec(
        "speculative", speculative.generate,
        'a small draft proposes a chain or tree of tokens; the target checks them all in one pass',
        (
            '**Speculative decoding** (Leviathan et al. 2023; Chen et al. 2023). A small draft proposes γ tokens; the '
            'target scores them all in one pass and keeps the longest prefix it agrees with, plus one token of its '
            'own. Sampling accepts a draft token x with probability min(1, p(x)/q(x)) and otherwise resamples from '
            "max(0, p − q), so the output keeps the target's distribution. The embedded model's draft is an EAGLE "
            "feature draft (Li et al. 2024): one layer that predicts the target's next hidden state from its current "
            'one, sharing its LM head. Greedy, it drafts a tree (EAGLE-2): each level expands the nodes whose whole '
            'path the draft finds likeliest, and the target checks every branch in one pass with tree attention, '
            'keeping the branch it agrees with. The tree also gets a branch copied from the text (prompt lookup, '
            "Saxena 2023): the tokens that followed the answer's last few tokens where they occurred before, so an "
            'answer that quotes its prompt or repeats itself commits several tokens a pass. Where the text offers no '
            "copy, the branch is what most of the target's earlier answers wrote after the same words (REST, He et al. "
            "2024: a datastore of its own answers, diamonds in the tree), and a few tokens guessed that way also go "
            "below the draft's likeliest branch."
        ), samples=True, controls=("gamma", "adaptive_gamma", "draft_tree_size", "copy_length", "retrieve"),
        plain=(
            'A small, cheap draft model guesses the next few tokens; the target checks all the guesses in one pass and '
            'keeps those it would have written itself, plus one token of its own: the same answer in fewer passes.'
        ),
    ),
    "medusa": MethodSpec(
        "medusa", medusa.generate,
        'extra heads on the target guess several tokens ahead; the target checks their tree in one pass',
        (
            "**Medusa** (Cai et al. 2024). Extra heads on the target's last hidden state guess the tokens 2, 3, 4 "
            'places ahead; their top candidates form a tree that the target checks in one pass, each node attending '
            'only to its ancestors (tree attention). Each pass the tree takes the paths the heads are surest of (the '
            "product of their confidences, as EAGLE-2 values a draft's nodes): deep where they are sure, wide where "
            "they are not. A node is accepted when its token is the target's argmax after its parent; the deepest "
            "accepted node's path is kept, plus the target's own next token, and only that path's KV entries stay in "
            "the cache. Beside the heads' nodes the tree holds a chain copied from the text (prompt lookup; squares in "
            "the tree), or where the text offers none, retrieved from the target's earlier answers (REST; diamonds). "
            "Greedy: the output equals AR's. To sample, Medusa's typical acceptance keeps a node when p(x) "
            '> min(ε, α·exp(−H(p))) (ε = 0.09, α = 0.3): plausible tokens pass, more of them where the target is '
            'unsure. It is faster but NOT distribution-preserving: the answer is no longer a sample of the target.'
        ), samples_when="typical_acceptance",
        controls=("tree", "tree_size", "typical_acceptance", "copy_length", "retrieve"),
        plain=(
            'Extra heads on the target guess the tokens two, three and four places ahead from its last pass; the next '
            'pass checks a small tree of those guesses at once and keeps the longest branch the target agrees with.'
        ),
    ),
    "lookahead": MethodSpec(
        "lookahead", lookahead.generate,
        'Jacobi iterations in a window make n-grams; the same pass checks the ones that fit',
        (
            '**Lookahead decoding** (Fu et al. 2024). One pass runs Jacobi iterations in a 2D window (W columns × N−1 '
            'levels), collects the n-grams each column produces into a pool, and verifies pool n-grams that start with '
            'the last token. Here the pool is also fed from the prompt, one candidate is copied from the text '
            "(prompt lookup decoding), and another is what most of the target's earlier answers wrote after the same "
            'words (REST, He et al. 2024).'
        ), controls=("window", "ngram", "candidates", "retrieve"),
        plain=(
            'No draft model: in the same pass that checks its guesses, the target also guesses a few tokens further '
            'ahead, collects the short phrases (n-grams) it saw, and tries them whenever the answer starts one again, '
            'beside phrases the model wrote in its earlier answers.'
        ),
    ),
    "jacobi": MethodSpec(
        "jacobi", jacobi.generate, 'guess a block, refine every guess at once until it stops changing',
        (
            '**Jacobi decoding** (Santilli et al. 2023). Guess a block of n tokens, then replace every guess at once '
            "with the target's prediction given the guesses before it; repeat until nothing changes: the fixed point "
            'is exactly the greedy answer. On an ordinary model about one token settles per pass, which the trajectory '
            'shows.'
        ), controls=("block_size",),
        plain=(
            'The target guesses a whole block of tokens, then re-runs one pass over the block again and again, fixing '
            'it from the left; each pass fixes at least one token, and sometimes several.'
        ),
    ),
    "cllm": MethodSpec(
        "cllm", cllm.generate, 'a copy of the target trained so that parallel (Jacobi) guesses settle in fewer passes',
        (
            '**CLLM** (Kou et al. 2024). A copy of the target fine-tuned so that from any state of a Jacobi trajectory '
            'it predicts the fixed point (consistency loss), while an AR loss keeps its answers close to the '
            "target's. Decoded by Jacobi (the paper's way), several tokens then settle in one pass (fast-forwarding) "
            'and some settle while the tokens before them are still wrong (stationary tokens), both marked in the '
            "trajectory. By default it is decoded by lookahead (Fu et al. 2024), which keeps a small Jacobi window "
            "and also checks the n-grams it produced: on our CLLM that commits more tokens a pass. It is a changed "
            "model: its greedy answer equals AR's on the CLLM's own weights and may differ from the base model's. "
            'Here: low-rank adapters trained on this CPU (assets/smollm2-135m-cllm).'
        ), controls=("decoder", "block_size", "window", "ngram", "candidates", "retrieve"),
        plain=(
            "A copy of the target trained (a CLLM) to get a guessed block's later tokens right sooner, so each pass "
            "fixes more of them; being a changed copy, its answer can differ from the original's."
        ),
    ),
    "beam": MethodSpec(
        "beam", beam.generate, 'keep the k likeliest partial answers (about search, not speed)',
        (
            "**Beam search** (as in transformers' `generate(num_beams=k)`). Keep the k best partial answers by total "
            "log-probability Σ log p(x_t | x_<t); each step, all k run in one batched pass, every beam's best "
            'continuations compete, the k best are kept and the rest pruned. A finished answer is scored by its '
            'log-probability divided by its length to the power of the length penalty (> 1 favours longer answers). It '
            "looks further ahead than greedy, so its answer can differ from AR's: it is about search, not speed."
        ), other_answer="not expected: beam search keeps k answers and may find a likelier one than greedy",
        controls=("num_beams", "length_penalty", "early_stopping"),
        plain='Not a speed-up: the target follows several candidate answers (beams) at once and keeps the likeliest; '
              'it searches for a better answer, not a faster one.',
    ),
    "contrastive": MethodSpec(
        "contrastive", contrastive.generate,
        'prefer what the target finds likely and a small amateur does not (about quality, not speed)',
        (
            '**Contrastive decoding** (Li et al. 2023). The target is the expert, our small draft the amateur. Each '
            'token maximises log p_expert(x) − log p_amateur(x) among the plausible tokens, those with p_expert(x) ≥ α '
            '· max p_expert (α = 0.1): what both models find likely (a generic or repeated phrase) is penalised, what '
            'only the stronger model sees is favoured. It is about quality, NOT speed: every token costs an expert and '
            "an amateur pass, and the answer differs from greedy AR on purpose. The expert's and the amateur's own "
            'greedy answers are shown beside it.'
        ), processors=False, other_answer="not expected: contrastive decoding rescores tokens against the amateur",
        controls=("alpha", "amateur_temperature"),
        plain="Not a speed-up: a small amateur model's preferences are subtracted from the target's, steering the "
              "answer away from bland, repetitive text.",
    ),
})


def get_method(name: str) -> MethodSpec:
    """The registry entry of method `name`; a SpecDemoError lists the known ones."""
    if name not in METHODS:
        raise SpecDemoError(f"unknown method {name!r}: choose one of {', '.join(METHODS)}")
    return METHODS[name]


def method_options(name: str, target: LoadedModel) -> MappingProxyType:
    """The keyword arguments method `name` needs for `target` beyond the common ones and `passes`,
    loaded from the companions its preset names (`specdemo.presets`), once, and held with the
    target (`LoadedModel.companions`). A compiled target's companions that decode (a draft, a
    CLLM) come with compiled passes of their own."""
    get_method(name)
    key = f"options of {name}" + (" compiled" if target.passes else "")
    return target.companions.get(key, lambda: MappingProxyType(load_options(name, target)))


def load_options(name: str, target: LoadedModel) -> dict:
    if name == "speculative":  # the feature draft where the preset has one, as it drafts better
        feature_draft = getattr(preset_for(target.spec), "feature_draft", None)
        draft = token_draft(target) if feature_draft is None else load_feature_draft(Path(feature_draft), target.model)
        passes = compile_passes(draft.model, DRAFT_BUCKETS, progress=log.info, role="draft") if target.passes else None
        return {"draft": draft, "draft_passes": passes, **datastore_of(target)}
    if name == "medusa":  # published heads bring no tree: the preset's is their default
        tree = getattr(preset_for(target.spec), "medusa_tree", None)
        heads = medusa.load_heads(companion(target, "medusa_heads"), target.model,
                                  tree and [list(path) for path in tree])
        graphs = FunctionGraphs() if target.passes and target.passes.graphs else None  # CUDA graphs of the heads
        return {"heads": heads, "heads_passes": graphs, **datastore_of(target)}
    if name == "cllm":
        model = target.companions.get("cllm", lambda: cllm.load_cllm(companion(target, "cllm"), target))
        passes = compile_passes(model, progress=log.info) if target.passes else None
        return {"cllm_model": model, "cllm_passes": passes, **datastore_of(target)}
    if name == "lookahead":
        return datastore_of(target)
    if name == "contrastive":  # the amateur is the token draft: a small LM of its own, which a feature draft is not
        return {"amateur": token_draft(target).model}
    return {}


def token_draft(target: LoadedModel) -> Draft:
    """The target's draft model (a small causal LM of its vocabulary), loaded once and held with
    the target: speculative decoding's draft where there is no feature draft, transformers'
    assistant, contrastive's amateur."""
    return target.companions.get("token draft", lambda: load_draft(companion(target, "draft"), target))


def datastore_of(target: LoadedModel) -> dict:
    """{"datastore": the target's earlier answers} where its preset has them (`retrieval`), else {};
    loaded once and held with the target."""
    folder = getattr(preset_for(target.spec), "datastore", None)
    if folder is None:
        return {}
    return {"datastore": target.companions.get("datastore",
                                               lambda: load_datastore(folder, target.model.config.vocab_size))}


MISSING_COMPANION = {
    "draft": "speculative decoding of {target} needs a draft with its vocabulary, and no preset names one: "
    "pass draft=load_draft(SPEC, target) with a small model of its family",
    "medusa_heads": "Medusa decoding of {target} needs heads trained for it, and no preset names any: "
    "pass heads=medusa.load_heads(FOLDER_OR_HUB_ID, model)",
    "cllm": "CLLM decoding of {target} needs a consistency-trained copy of it, and no preset names one: pass "
    "cllm_model=cllm.load_cllm(SPEC, target), e.g. SPEC 'cllm/consistency-llm-7b-sharegpt48k' for its ShareGPT "
    "Llama-7B",
}


def companion(target: LoadedModel, kind: str) -> str | Path:
    """The spec of `target`'s companion of `kind` ("draft", "medusa_heads" or "cllm"), from its preset."""
    preset = preset_for(target.spec)
    spec = getattr(preset, kind) if preset else None
    if spec is None:
        raise SpecDemoError(MISSING_COMPANION[kind].format(target=target.spec))
    return spec


def decoded(name: str, target: LoadedModel) -> tuple[PreTrainedModel, CompiledPass | None]:
    """The weights method `name` decodes, whose greedy AR answer it must equal, and their compiled
    pass: the target's, except for a method that brings its own (cllm's consistency-trained copy)."""
    options = method_options(name, target)
    if "cllm_model" in options:
        return options["cllm_model"], options["cllm_passes"]
    return target.model, target.passes
