"""Every method, with every kind of draft, obeys the step-event protocol and, where it should,
gives exactly AR's greedy answer (float32, tiny random models); proposals that are always right
and always wrong both give AR's answer through the one decoding loop."""

import copy
import threading

import pytest
import torch

from specdemo.core.events import StepEvent, Summary, final_summary
from specdemo.core.loop import Proposed, Proposer, decode
from specdemo.core.sampling import GREEDY, SamplingConfig
from specdemo.core.verify import Proposal
from specdemo.methods import ar, beam, cllm, contrastive, jacobi, lookahead, medusa, speculative
from specdemo.methods.draft import Draft

from conftest import make_tiny_model
from test_eagle import feature_draft
from test_medusa import CHOICES, random_heads
from test_static_draft_tree import IRREGULAR as STATIC_PATHS

MAX_NEW_TOKENS = 24


class NegatedDraft(Draft):
    """A token draft that proposes the target's least likely token: always wrong."""

    def logits(self, input_ids, cache, logits_to_keep=1, **tree):
        return -super().logits(input_ids, cache, logits_to_keep, **tree)


@pytest.fixture(scope="module")
def target():
    return make_tiny_model()


@pytest.fixture(scope="module")
def other():
    return make_tiny_model(seed=1)


def configurations(target, other):
    """(generate, its keyword arguments, the model whose AR answer it must equal or None)."""
    own = copy.deepcopy(other)  # a CLLM decodes its own weights
    heads = random_heads(target)
    return {
        "ar": (ar.generate, {}, target),
        "speculative, token draft, chain": (speculative.generate,
                                            dict(draft=Draft("other", other), gamma=3, draft_tree_size=0), target),
        "speculative, token draft, tree": (speculative.generate,
                                           dict(draft=Draft("other", other), gamma=3, draft_tree_size=6), target),
        "speculative, feature draft, chain": (speculative.generate,
                                              dict(draft=feature_draft(target), gamma=3, draft_tree_size=0), target),
        "speculative, feature draft, tree": (speculative.generate,
                                             dict(draft=feature_draft(target), gamma=3, draft_tree_size=6), target),
        "speculative, token draft, static tree": (speculative.generate, dict(draft=Draft("other", other), gamma=3,
                                                                      draft_tree_top_k=2, static_tree=True), target),
        "speculative, feature draft, static tree": (speculative.generate, dict(draft=feature_draft(target), gamma=4,
                                                                        static_tree=STATIC_PATHS), target),
        "speculative, feature draft reading a layer, tree": (
            speculative.generate, dict(draft=feature_draft(target, layers=(1,)), gamma=3, draft_tree_size=6), target),
        "speculative, always-right draft": (speculative.generate,
                                            dict(draft=Draft("target", target), gamma=4, draft_tree_size=0), target),
        "speculative, always-wrong draft": (speculative.generate, dict(draft=NegatedDraft("target", target), gamma=4,
                                                                       draft_tree_size=0), target),
        "speculative, always-wrong tree": (speculative.generate, dict(draft=NegatedDraft("target", target), gamma=3,
                                                                      draft_tree_size=6, copy_length=0), target),
        "medusa, dynamic tree": (medusa.generate, dict(heads=heads, tree="dynamic", tree_size=8), target),
        "medusa, static tree": (medusa.generate, dict(heads=heads, tree=CHOICES), target),
        "medusa, chain": (medusa.generate, dict(heads=heads, tree="chain", copy_length=0), target),
        "lookahead": (lookahead.generate, dict(window=3, ngram=3, candidates=3), target),
        "lookahead, no text n-grams": (lookahead.generate, dict(window=2, ngram=4, candidates=2, text_ngrams=False),
                                       target),
        "jacobi": (jacobi.generate, dict(block_size=5), target),
        "cllm, jacobi": (cllm.generate, dict(cllm_model=own, decoder="jacobi", block_size=5), own),
        "cllm, lookahead": (cllm.generate, dict(cllm_model=own, decoder="lookahead", window=3, ngram=3, candidates=3),
                            own),
        "beam": (beam.generate, dict(num_beams=3), None),
        "contrastive": (contrastive.generate, dict(amateur=other), None),
    }


NAMES = [
    "ar", "speculative, token draft, chain", "speculative, token draft, tree", "speculative, feature draft, chain",
    "speculative, feature draft, tree", "speculative, token draft, static tree",
    "speculative, feature draft, static tree", "speculative, feature draft reading a layer, tree",
    "speculative, always-right draft", "speculative, always-wrong draft", "speculative, always-wrong tree",
    "medusa, dynamic tree", "medusa, static tree", "medusa, chain", "lookahead",
    "lookahead, no text n-grams", "jacobi", "cllm, jacobi", "cllm, lookahead", "beam", "contrastive",
]


def eager_answers(configs: dict) -> dict:
    """Each configuration's greedy answer on its reference weights, eagerly (before any graphs)."""
    prompt = torch.tensor([[5, 17, 42, 8, 63, 21]])
    return {name: final_summary(configs[name][0](configs[name][2], prompt, max_new_tokens=MAX_NEW_TOKENS,
                                                 eos_token_ids=(), **configs[name][1])).tokens
            for name in NAMES if configs[name][2] is not None}


def check_protocol(items: list, max_new_tokens: int, eos: tuple[int, ...] = ()) -> Summary:
    """The rules of `specdemo.core.events`, checked on one run's stream; returns its Summary."""
    *events, summary = items
    assert isinstance(summary, Summary) and all(isinstance(e, StepEvent) for e in events)
    answer, proposed, accepted, draft_forwards = [], 0, 0, 0
    for step, event in enumerate(events):
        assert event.step == step and event.target_forwards == step + 1  # one event a target pass
        assert event.committed[: len(event.accepted)] == event.accepted  # accepted proposals come first
        assert len(event.accepted) <= len(event.proposed)
        assert event.draft_forwards >= draft_forwards  # a running total
        assert not any(token in eos for token in answer)  # nothing is committed after an EOS
        answer += event.committed
        proposed, accepted, draft_forwards = \
            proposed + len(event.proposed), accepted + len(event.accepted), event.draft_forwards
    assert list(summary.tokens) == answer and 0 < len(answer) <= max_new_tokens
    assert (summary.target_forwards, summary.steps, summary.draft_forwards) == (len(events), len(events),
                                                                                draft_forwards)
    assert (summary.proposed, summary.accepted) == (proposed, accepted)
    expected = "eos" if answer[-1] in eos else "length"
    assert summary.finish_reason == expected and (expected == "eos" or len(answer) == max_new_tokens)
    return summary


@pytest.mark.parametrize("name", NAMES)
def test_every_method_obeys_the_protocol_and_greedy_gives_ars_answer(target, other, prompt_ids, name):
    generate, options, reference = configurations(target, other)[name]
    summary = check_protocol(list(generate(target, prompt_ids, max_new_tokens=MAX_NEW_TOKENS, eos_token_ids=(),
                                           **options)), MAX_NEW_TOKENS)
    if reference is not None:
        expected = list(ar.generate(reference, prompt_ids, max_new_tokens=MAX_NEW_TOKENS, eos_token_ids=()))[-1].tokens
        assert summary.tokens == expected
    if name.endswith("always-right draft"):
        assert summary.accepted == summary.proposed > 0 and summary.target_forwards < len(summary.tokens) / 2
    if "always-wrong" in name:
        assert summary.accepted == 0 and summary.proposed > 0 and summary.target_forwards == len(summary.tokens)
    # an EOS inside the answer ends it there, in every method that gives AR's answer
    eos = (summary.tokens[10],)
    ended = check_protocol(list(generate(target, prompt_ids, max_new_tokens=MAX_NEW_TOKENS, eos_token_ids=eos,
                                         **options)), MAX_NEW_TOKENS, eos)
    if reference is not None:
        assert ended.tokens == summary.tokens[: summary.tokens.index(eos[0]) + 1]
    # a stop signal set before the first pass ends the run with no pass at all
    stop = threading.Event()
    stop.set()
    *events, stopped = generate(target, prompt_ids, max_new_tokens=MAX_NEW_TOKENS, eos_token_ids=(), stop=stop,
                                **options)
    assert events == [] and stopped.finish_reason == "stopped" and stopped.tokens == ()


class Scripted(Proposer):
    """Proposes, after the answer so far, the next `depth` tokens of `answer` (right) or each one
    plus one (wrong), as a chain, or as a tree that puts a wrong sibling before each right node."""

    def __init__(self, prompt_length: int, answer: list[int], depth: int, right: bool, tree: bool, vocab_size: int):
        self.prompt_length, self.answer, self.depth, self.right, self.tree, self.vocab_size = \
            prompt_length, answer, depth, right, tree, vocab_size

    def propose(self, context, sequence, room):
        done = sequence.shape[1] - self.prompt_length
        wanted = self.answer[done : done + min(self.depth, room - 1)]
        tokens = wanted if self.right else [(t + 1) % self.vocab_size for t in wanted]
        if not self.tree:
            return Proposed(Proposal.chain(tokens, "script"))
        nodes, parents, parent = [], [], -1
        for token in tokens:  # a decoy, then the scripted token, each under the scripted path so far
            nodes += [(token + 2) % self.vocab_size, token]
            parents += [parent, parent]
            parent = len(nodes) - 1
        return Proposed(Proposal(tuple(nodes), tuple(parents), ("script",) * len(nodes)))


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("right", [True, False], ids=["always right", "always wrong"])
@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(repetition_penalty=1.3)],
                         ids=["greedy", "repetition penalty"])
def test_always_right_and_always_wrong_proposals_give_ars_answer(target, prompt_ids, tree, right, sampling):
    expected = list(ar.generate(target, prompt_ids, max_new_tokens=MAX_NEW_TOKENS, sampling=sampling,
                                eos_token_ids=()))[-1].tokens
    proposer = Scripted(prompt_ids.shape[1], list(expected), 4, right, tree, target.config.vocab_size)
    items = list(decode(target, prompt_ids, proposer, method="scripted", max_new_tokens=MAX_NEW_TOKENS,
                        sampling=sampling, eos_token_ids=()))
    summary = check_protocol(items, MAX_NEW_TOKENS)
    assert summary.tokens == expected
    if right:  # every scripted token is accepted: 4 and the target's own a pass
        assert summary.accepted == MAX_NEW_TOKENS - summary.target_forwards \
            and summary.target_forwards == -(-MAX_NEW_TOKENS // 5)
    else:
        assert summary.accepted == 0 and summary.target_forwards == MAX_NEW_TOKENS
