"""Speculative decoding: a draft proposes γ tokens, the target verifies them in one pass.

Leviathan, Kalman & Matias 2023, "Fast Inference from Transformers via Speculative Decoding"
(Algorithm 1), and Chen et al. 2023, "Accelerating LLM Decoding with Speculative Sampling".
Greedy: keep the longest prefix of the draft that equals the target's argmax, then the
target's own token. Sampling: accept draft token x with probability min(1, p(x)/q(x)); on the
first rejection resample from norm(max(0, p - q)); after a full acceptance take a bonus token
from p. Both keep the target's output exactly (greedy) or its distribution exactly (sampling).

The draft is a token draft (`draft.Draft`: any small causal LM of the target's vocabulary) or a
feature draft (`eagle.FeatureDraft`, Li et al. 2024), which drafts from the target's own last
hidden states: the verification pass then also returns them, and the draft's cache keeps only
the pairs whose feature the target computed.

Plain greedy decoding drafts a tree rather than a chain (`draft_tree`, EAGLE-2): one target pass
verifies every branch with tree attention and keeps the branch it agrees with. The tree also
gets a branch copied from the text (`prompt_lookup`) where the text's end occurred before, so
answers that quote their prompt commit runs the draft would not guess; where the text offers
none, from a datastore of the target's earlier answers (`retrieval`, REST). Below the draft's
likeliest branch it gets a few more tokens guessed the same way (`draft_tree.extend_likeliest`).
Sampling drafts the chain, whose rejection rule above keeps the target's distribution.
"""

import threading
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from transformers import Cache, PreTrainedModel

from specdemo.core.errors import SpecDemoError, check_whole
from specdemo.core.events import StepEvent, Summary, acceptance_by_position
from specdemo.core.kvcache import keep_prefix
from specdemo.core.loop import Context, Learned, Proposed, Proposer, Verdict, decode
from specdemo.core.sampling import GREEDY, SamplingConfig, TokenChooser, logits_processors
from specdemo.core.static import CompiledPass, fitted_copy, fitted_size, request_cache
from specdemo.core.steps import ChainStep, SamplingCheck, TreeStep
from specdemo.core.transfer import tensor_on
from specdemo.core.verify import Proposal, TargetPass, accept_greedy, choices_after
from specdemo.methods import draft_tree, static_draft_tree
from specdemo.methods.device_draft_tree import device_grow, read_tree
from specdemo.methods.draft import Draft
from specdemo.methods.eagle import FeatureDraft
from specdemo.methods.prompt_lookup import COPY_LENGTH, check_copy_length, until_eos
from specdemo.methods.retrieval import Datastore, guessed_branch

MAX_GAMMA = 16
MAX_STATIC_NODES = 128  # a static draft tree's nodes at most, as a Medusa tree's (`medusa_tree.MAX_TREE_SIZE`)
EXTEND_LENGTH = 4  # tokens guessed below the draft's likeliest branch (docs/methods/speculative.md)
RETRIEVED_SHARE = 0.5  # a retrieved guess goes on while at least half the earlier answers that agreed so far agree on
# the next token: past that its nodes are seldom accepted, and on a CPU each node costs a few percent of an AR pass

# a tree's nodes where the method chooses (`auto_tree_size`), with draft_tree_top_k = 3, 2 deep: the fastest size on a
# CPU, where each node costs a few percent of a pass (`git show 4f4c763:docs/methods/speculative.md`); a GPU's set has
# its own (`specdemo.defaults`)
AUTO_TREE_SIZE = 7


def generate(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    draft: Draft | FeatureDraft,
    max_new_tokens: int = 128,
    sampling: SamplingConfig = GREEDY,
    gamma: int = 2,
    adaptive_gamma: bool = False,
    draft_tree_size: int | None = None,
    draft_tree_top_k: int = 3,
    auto_tree_size: int = AUTO_TREE_SIZE,
    static_tree: bool | Sequence[Sequence[int]] = False,
    copy_length: int | None = None,
    retrieve: bool = True,
    datastore: Datastore | None = None,
    eos_token_ids: Iterable[int] | None = None,
    stop: threading.Event | None = None,
    passes: CompiledPass | None = None,
    draft_passes: CompiledPass | None = None,
) -> Iterator[StepEvent | Summary]:
    """Decode after `input_ids` [1, L]; each target pass verifies up to `gamma` draft tokens.
    `draft_tree_size` > 0 drafts a tree of that many nodes instead of a chain (`draft_tree`, EAGLE-2),
    `gamma` deep, expanding `draft_tree_top_k` nodes per level; None chooses: a tree of
    `auto_tree_size` nodes for plain greedy decoding, the chain otherwise (a tree is verified
    greedily, without logits processors). `static_tree`: the tree is instead a static one
    (`static_draft_tree`), whose tokens the host reads with the target's choices: True, the first
    `draft_tree_size` of the paths the draft brings (`FeatureDraft.tree_choices`) at most `gamma`
    deep, else every node with `draft_tree_top_k` children, `gamma` deep; or its rank paths (the
    medusa_choices form), at most `gamma` deep. `copy_length` > 0 adds to a tree a branch of up to
    that many tokens copied from the text (prompt lookup); None chooses COPY_LENGTH with a tree.
    Where the text offers no copy, `retrieve` takes the branch from `datastore` (earlier answers
    of the target: `retrieval`, REST), and below the draft's likeliest branch the tree gets up to
    EXTEND_LENGTH (at most `copy_length`) tokens guessed the same way (`draft_tree.extend_likeliest`).
    `passes`, `draft_passes`: the target's and the draft's compiled static passes (None: eager); the
    draft's run only beside the target's."""
    check_whole("gamma", gamma, 1, MAX_GAMMA, "draft tokens per step")
    draft_tree_size = resolve_tree_size(draft_tree_size, draft_tree_top_k, sampling, auto_tree_size)
    copy_length = resolve_copy_length(copy_length, draft_tree_size)
    choices = draft.tree_choices if isinstance(draft, FeatureDraft) else ()
    paths = static_paths(static_tree, choices, draft_tree_top_k, gamma, draft_tree_size)
    # the draft's cache holds the prompt, what may still come and a step's deepest feed (a static tree's: at most
    # its nodes); static, run by the draft's compiled pass, beside a compiled target's
    feed = max(MAX_GAMMA * (draft_tree_top_k + 1), len(paths))
    cache = request_cache(draft.model, input_ids.shape[1] + max_new_tokens + feed, draft_passes if passes else None)
    proposer = DraftProposer(draft, gamma, adaptive_gamma, draft_tree_size, draft_tree_top_k, copy_length, cache,
                             datastore if retrieve else None,
                             static_draft_tree.prepare(paths, draft.model.device) if paths else None)
    return decode(model, input_ids, proposer, method="speculative", max_new_tokens=max_new_tokens, sampling=sampling,
                  eos_token_ids=eos_token_ids, stop=stop, passes=passes)


@dataclass(frozen=True)
class DraftPass:
    """What one pass drafted, beside its proposal: γ for this pass (0: nothing, the first pass of a
    feature draft), whether the proposal is a draft tree (else a chain) and the token it hangs
    from, the draft's passes it took and a sampled chain's distributions q."""

    gamma: int
    tree: bool = False
    draft_passes: int = 0  # a tree's: one a level grown; a chain's: one a token
    q: torch.Tensor | None = None  # [g, V] the draft's distributions of a sampled chain
    root: int = -1  # a tree's root: the text's last token, read on the host where the tree was grown
    # a static tree's drafted nodes' log-probabilities, on the device until the verdict reads them
    log_probs: torch.Tensor | None = None


class DraftProposer(Proposer):
    """Proposes the draft's chain or tree (with a branch copied from the text); learns by rolling
    the draft's cache back to what the target kept, queuing the draft's first pass for the next
    proposal (on a GPU it runs while the host records this one) and, with adaptive γ, by changing γ.

    A feature draft needs the target's features of the positions before it drafts: the verification
    pass returns them (`features`), and the draft's cache keeps only the pairs whose feature the
    target computed. The first pass therefore drafts nothing."""

    def __init__(self, draft: Draft | FeatureDraft, gamma: int, adaptive_gamma: bool, tree_size: int, top_k: int,
                 copy_length: int, cache: Cache, datastore: Datastore | None = None,
                 static: static_draft_tree.StaticTree | None = None):
        self.draft, self.gamma, self.adaptive_gamma, self.static = draft, gamma, adaptive_gamma, static
        self.tree_size, self.top_k, self.copy_length, self.datastore = tree_size, top_k, copy_length, datastore
        self.features = draft.feature_request if isinstance(draft, FeatureDraft) else False
        self.cache = cache  # the draft's own KV cache for the request
        # [1, m, H] the target's features of the positions its cache holds ([1, m, (k + 1) H] with k layers)
        self.target_features: torch.Tensor | None = None
        # the draft's first pass after the text (`draft_tree.first_logits`), queued by `learn` for the next proposal
        self.first: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def propose(self, context: Context, sequence: torch.Tensor, room: int) -> Proposed:
        ready = self.target_features is not None or not self.features
        gamma = min(self.gamma, room - 1) if ready else 0
        if self.static is not None and gamma >= self.static.depth:  # else (near the request's end) a grown tree
            return self.static_tree(context, sequence, room)
        if self.tree_size and gamma:
            tree, draft_passes, root = self.grown_tree(context, sequence, room, gamma)
            return Proposed(tree, DraftPass(gamma, tree=True, draft_passes=draft_passes, root=root))
        drafted, q = propose(self.draft, self.cache, sequence, self.target_features, gamma, context.choose,
                             context.eos, context.model.config.vocab_size, self.first)
        return Proposed(Proposal.chain(drafted, "draft"), DraftPass(gamma, draft_passes=gamma, q=q))

    def grown_tree(self, context: Context, sequence: torch.Tensor, room: int, gamma: int) -> tuple[Proposal, int, int]:
        """The draft tree `gamma` deep (EAGLE-2), with a branch copied from the text or retrieved and
        a guess below its likeliest branch, the draft's passes that grew it and its root token."""
        length = min(self.copy_length, room - 1)
        text = context.text.of(sequence)
        extend = min(EXTEND_LENGTH, self.copy_length, room - 1 - gamma)  # below the likeliest branch, in the request

        def size_of(guessed: int) -> int:  # beside `guessed` tokens copied and guessed (compiled: to fill its pass)
            return fitted_size(self.tree_size, guessed, context.bucket, context.device)

        # on a GPU the host's work overlaps the draft's: its first pass was queued as the last pass was learned,
        # and where the draft can, its tree of the largest size grown on the device (one graph for every step;
        # every level runs) is queued before the host guesses a branch
        first = self.first_pass(sequence)
        # the largest tree any guess leaves room for, and the children a node that fill it
        most = max(map(size_of, range(self.copy_length + min(EXTEND_LENGTH, self.copy_length) + 1)))
        # sized for γ's full depth, not the `gamma` levels a step near the answer's end keeps: on the device one graph
        # then grows every step's tree, none captured mid-answer
        top_k = self.top_k if context.bucket is None else draft_tree.children_to_fill(most, self.gamma, self.top_k)
        grown = device_grow(self.draft, self.cache, first, depth=self.gamma, levels=gamma, top_k=top_k, most=most,
                            eos=context.eos)
        copied, source = guessed_branch(text, length, context.eos, self.datastore, RETRIEVED_SHARE)
        size = size_of(len(copied) + max(extend, 0))
        if grown is not None:  # its graph ran every level
            tree, draft_passes = read_tree(grown, size), self.gamma
        else:  # grown on the host, a level at a time
            tree, draft_passes = draft_tree.grow(self.draft, self.cache, sequence, self.target_features, depth=gamma,
                                                 top_k=top_k, size=size, eos=context.eos, first=first)
        tree = draft_tree.add_copy(tree, copied, source=source)
        tree = draft_tree.extend_likeliest(tree, text, extend, context.eos, self.datastore, RETRIEVED_SHARE)
        return tree, draft_passes, int(text[-1])

    def first_pass(self, sequence: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The draft's first pass after `sequence`: the one `learn` queued, else (the prompt's) run now."""
        if self.first is None:
            return draft_tree.first_logits(self.draft, self.cache, sequence, self.target_features)
        return self.first

    def static_tree(self, context: Context, sequence: torch.Tensor, room: int) -> Proposed:
        """The static tree (`static_draft_tree`) with a branch copied from the text or retrieved, its
        tokens and values left on the device."""
        text = context.text.of(sequence)
        first = self.first_pass(sequence)
        copied, source = guessed_branch(text, min(self.copy_length, room - 1), context.eos, self.datastore,
                                        RETRIEVED_SHARE)
        copied = copied[: fitted_copy(self.static.plan.shape.size, len(copied), context.bucket)]
        tree, log_probs = static_draft_tree.static_tree(self.draft, self.cache, first, self.static, copied, source)
        depth = self.static.depth
        return Proposed(tree, DraftPass(depth, tree=True, draft_passes=depth, root=int(text[-1]),
                                        log_probs=log_probs))

    def accept(self, context: Context, sequence: torch.Tensor, proposed: Proposed, verified: TargetPass) -> Verdict:
        """Greedy: exact match (a tree's deepest agreeing branch). Sampling: the speculative sampling rule."""
        proposal, drafted = proposed.proposal, proposed.step
        if context.choose.config.do_sample:
            tokens = sequence.new_tensor(proposal.tokens)
            candidate = torch.cat([sequence, tokens[None]], dim=-1)
            accept_length, token, details = accept_sampled(context.choose, candidate, verified.logits, tokens,
                                                           drafted.q)
            return Verdict(list(range(accept_length)), token, details)
        if proposal.on_device is not None:  # a static tree: the shared rule reads it with the choices
            return super().accept(context, sequence, proposed, verified)
        choices = choices_after(context.choose, sequence, proposal, verified.logits)
        path, token = accept_greedy(proposal, choices)
        return Verdict(path, token, {} if drafted.tree else {"target_choices": choices})

    def learn(self, context: Context, sequence: torch.Tensor, proposed: Proposed, verified: TargetPass,
              verdict: Verdict, kept: list[int], room: int) -> Learned:
        n, path = verified.cached + verified.pending, verdict.path  # n: the text's length before this pass committed
        proposal, drafted = proposed.proposal, proposed.step
        if drafted.log_probs is not None:  # a static tree, read with the verdict: its values, for the event (read
            proposal = static_draft_tree.static_values(proposal, drafted.log_probs)  # before more work is queued)
        # Roll back the draft: it keeps what it saw of the committed tokens and the accepted draft
        # tokens (a feature draft: only the pairs fed the target's features).
        if self.features:
            kept_rows = tensor_on([*range(verified.pending), *(verified.pending + node for node in path)],
                                  verified.hidden.device)
            self.target_features = torch.cat([*([] if self.target_features is None else [self.target_features]),
                                              verified.hidden.index_select(1, kept_rows)], dim=1)
            keep_prefix(self.cache, min(self.cache.get_seq_length(), n - 1))
        else:
            keep_prefix(self.cache, min(self.cache.get_seq_length(), n + len(path)))
        # the next proposal's first draft pass, queued now: on a GPU it runs while the host records this pass (a
        # proposal drafts where it leaves room for the target's own token)
        self.first = None if room < 2 else draft_tree.first_logits(self.draft, self.cache, sequence,
                                                                   self.target_features)
        if drafted.tree:
            turned_down = draft_tree.best_continuation(proposal, path[-1] if path else -1)
            data = TreeStep(proposal, drafted.root, path, [*path, *turned_down],
                            gamma=max(proposal.depths), target_token=verdict.token)
            rejected = [proposal.tokens[node] for node in turned_down]
        else:
            numbers = dict(gamma=proposal.size, accept_length=len(path), target_token=verdict.token)
            data = (SamplingCheck(**numbers, **verdict.details) if "p" in verdict.details
                    else ChainStep(**numbers, **verdict.details))
            rejected = list(proposal.tokens[len(path) :])
        # Learn: adaptive γ grows after a full acceptance and shrinks after an early rejection
        # (a copied branch can commit more than γ: that is no rejection).
        if self.adaptive_gamma and drafted.gamma == self.gamma:
            self.gamma = min(self.gamma + 2, MAX_GAMMA) if len(path) >= self.gamma else max(self.gamma - 1, 1)
        return Learned(rejected, drafted.draft_passes, data)

    def summary(self, events: list[StepEvent]) -> dict:
        return {"acceptance_by_position": acceptance_by_position(events)}


def resolve_tree_size(draft_tree_size: int | None, draft_tree_top_k: int, sampling: SamplingConfig,
                      auto: int = AUTO_TREE_SIZE) -> int:
    """The number of tree nodes to draft (0: a chain), checked against the decoding rule; None:
    `auto` nodes for plain greedy decoding, else a chain."""
    plain_greedy = not sampling.do_sample and not logits_processors(sampling)
    check_whole("draft_tree_top_k", draft_tree_top_k, 1)
    check_whole("auto_tree_size", auto, 1, what="draft tree nodes when the method chooses")
    if draft_tree_size is None:
        return auto if plain_greedy else 0
    check_whole("draft_tree_size", draft_tree_size, 0, what="draft tree nodes, 0 for a chain")
    if draft_tree_size and not plain_greedy:
        raise SpecDemoError(
            "a draft tree is verified greedily, without logits processors: for sampling or a repetition penalty "
            "draft a chain (draft_tree_size=0), whose rejection-sampling rule keeps the target's distribution"
        )
    return draft_tree_size


def static_paths(static_tree: bool | Sequence[Sequence[int]], choices: static_draft_tree.Paths, top_k: int,
                 gamma: int, draft_tree_size: int) -> static_draft_tree.Paths:
    """The rank paths of the static tree that `static_tree` asks for (() for none), checked: True
    takes the first `draft_tree_size` of the draft's `choices` at most `gamma` deep, or where it
    brings none the full tree of `top_k` children a node, `gamma` deep."""
    if static_tree is False:
        return ()
    if not draft_tree_size:
        raise SpecDemoError("a static draft tree is verified greedily: decode greedily without logits processors, "
                            "with a draft tree (draft_tree_size above 0, or None)")
    if static_tree is True and choices:
        static_tree = [path for path in choices if len(path) <= gamma][:draft_tree_size]
    if static_tree is True:
        if sum(top_k**depth for depth in range(1, gamma + 1)) > MAX_STATIC_NODES:
            raise SpecDemoError(f"a full static draft tree of {top_k} children a node, {gamma} deep, is too large: "
                                f"at most {MAX_STATIC_NODES} nodes")
        return static_draft_tree.full_paths(top_k, gamma)
    paths = tuple(tuple(int(rank) for rank in path) for path in static_tree)
    if len(paths) > MAX_STATIC_NODES or max(map(len, paths), default=0) > gamma:
        raise SpecDemoError(f"a static draft tree's paths: at most {MAX_STATIC_NODES} of them, at most gamma deep")
    return paths


def resolve_copy_length(copy_length: int | None, draft_tree_size: int) -> int:
    """The number of tokens to copy into the draft tree (0: none), checked against the tree."""
    if copy_length is None:
        return COPY_LENGTH if draft_tree_size else 0
    if check_copy_length(copy_length) and not draft_tree_size:
        raise SpecDemoError(
            "copied tokens are a branch of the draft tree, which only plain greedy decoding drafts: "
            "decode greedily with a draft_tree_size above 0, or set copy_length=0"
        )
    return copy_length


def draft_logits(
    draft: Draft | FeatureDraft, cache: Cache, sequence: torch.Tensor, features: torch.Tensor | None,
    first: tuple[torch.Tensor, torch.Tensor | None] | None = None,
) -> Generator[torch.Tensor, torch.Tensor, None]:
    """The draft's logits [1, K] for one next token after another; send each chosen token [1, 1]
    back. A token draft reads the tokens its cache has not seen; a feature draft the pairs
    (f_t, x_{t+1}) whose feature the target computed, then its own predicted features (EAGLE).
    `first`: the first pass's, where it ran already (`draft_tree.first_logits`)."""
    logits, state = first or draft_tree.first_logits(draft, cache, sequence, features)
    while True:
        token = yield logits
        logits, state = draft_tree.branch_logits(draft, cache, token[0], state)


def propose(
    draft: Draft | FeatureDraft,
    cache: Cache,
    sequence: torch.Tensor,
    features: torch.Tensor | None,
    gamma: int,
    choose: TokenChooser,
    eos: tuple[int, ...],
    vocab_size: int,
    first: tuple[torch.Tensor, torch.Tensor | None] | None = None,
) -> tuple[list[int], torch.Tensor | None]:
    """Draft `gamma` tokens autoregressively, one draft pass each, and return them up to and
    including the first EOS (g tokens), with when sampling their distributions q [g, V] (V: the
    target's vocabulary) under the same logits processing as the target. The host reads the
    tokens once, after the last pass: on a GPU a read per token would wait for each pass in turn.
    Tokens drafted past an EOS are dropped; the draft's cache drops them when the proposer learns.
    `first`: the draft's first pass, where it ran already."""
    tokens, q = [], []
    extended = sequence
    steps = draft_logits(draft, cache, sequence, features, first)
    token = None
    for _ in range(gamma):
        logits = steps.send(token)  # [1, K]; sending None starts it
        if choose.config.do_sample or choose.processors:
            scores = choose.scores(extended, draft.spread(logits, vocab_size))  # [1, V]
            if choose.config.do_sample:
                probs = torch.softmax(scores, dim=-1)
                token = torch.multinomial(probs, 1, generator=choose.generator)
                q.append(probs[0])
            else:
                token = scores.argmax(dim=-1, keepdim=True)
        else:
            token = draft.token_ids(logits.argmax(dim=-1, keepdim=True))  # [1, 1]
        tokens.append(token)
        if choose.processors:  # what they read: the text and the tokens drafted so far
            extended = torch.cat([extended, token], dim=-1)
    drafted = until_eos(torch.cat(tokens, dim=-1)[0].tolist() if tokens else [], eos)
    return drafted, (torch.stack(q[: len(drafted)]) if q else None)


def accept_sampled(
    choose: TokenChooser, candidate: torch.Tensor, logits: torch.Tensor, draft_tokens: torch.Tensor, q: torch.Tensor
) -> tuple[int, int, dict]:
    """The speculative sampling rule (Leviathan et al. 2023, Algorithm 1)."""
    g = draft_tokens.shape[0]
    n = candidate.shape[1] - g
    if g == 0:  # nothing was drafted (no room left): one token from p
        p = torch.softmax(choose.scores(candidate, logits[:1]), dim=-1)
        return 0, int(torch.multinomial(p[0], 1, generator=choose.generator)), {}
    p = torch.cat([torch.softmax(choose.scores(candidate[:, : n + i], logits[i : i + 1]), dim=-1)
                   for i in range(g + 1)])
    drafted = torch.arange(g, device=p.device)  # made there: an index from the host would be a copy that waits
    p_x = p[drafted, draft_tokens]  # [g] target probability of each draft token
    q_x = q[drafted, draft_tokens]  # [g] draft probability of each draft token
    acceptance = torch.clamp(p_x / q_x, max=1.0)  # min(1, p/q)
    draws = torch.rand(g, generator=choose.generator, device=p.device)  # r ~ U(0, 1)
    rejected = (draws >= acceptance).nonzero()
    accept_length = int(rejected[0]) if len(rejected) else g
    if accept_length < g:
        residual = torch.clamp(p[accept_length] - q[accept_length], min=0)  # max(0, p - q), renormalized
        next_token = torch.multinomial(residual / residual.sum(), 1, generator=choose.generator)
    else:
        next_token = torch.multinomial(p[g], 1, generator=choose.generator)  # bonus token from p
    details = {"p": p_x.tolist(), "q": q_x.tolist(), "acceptance": acceptance.tolist(), "draws": draws.tolist()}
    return accept_length, int(next_token), details
