"""Lookahead decoding: Jacobi iteration in a 2D window makes n-grams; the same pass verifies old ones.

Fu, Bailis, Stoica & Zhang 2024, "Break the Sequential Dependency of LLM Inference Using
Lookahead Decoding" (Sec. 3, Fig. 3). One target pass feeds three groups of tokens:

- the committed tokens the cache has not seen yet (usually just the last one);
- the verification branch: up to G n-grams from the pool whose first token is the last
  committed token, each a chain of its N-1 continuation tokens;
- the lookahead branch: a window of W columns and N-1 levels, level l holding the Jacobi
  iterate l steps old; column c of level l sits at position c + l + 1 after the last committed
  token and sees level 0 up to column c, then column c of the levels above it.

The target's argmax after the last level gives a new level; each column, read down the levels
and into the new token, is an n-gram for the pool. The verification branch is checked like a
greedy speculative draft (exact match), so the output equals greedy AR.

With `text_ngrams` the pool also holds the n-grams of the prompt and of the answer so far, and
the first candidate is copied from the text itself: the tokens that followed the latest earlier
occurrence of the text's last few tokens, up to `copy_length` of them (prompt lookup decoding,
Saxena 2023). Answers that quote their input (summaries, answers from a passage, code edits)
then commit several tokens a pass. With a `datastore` of the target's earlier answers the next
candidate is what most of them wrote after the text's last few tokens (`retrieval`, REST): the
phrases the target keeps writing, before its own window has produced them.
"""

import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from specdemo.core.errors import check_whole
from specdemo.core.events import StepEvent, Summary
from specdemo.core.loop import Context, Learned, Proposed, Proposer, Verdict, decode
from specdemo.core.sampling import GREEDY, SamplingConfig
from specdemo.core.static import CompiledPass
from specdemo.core.steps import LookaheadStep
from specdemo.core.verify import Proposal, TargetPass
from specdemo.methods.jacobi import check_greedy
from specdemo.methods.prompt_lookup import copy_from_text, until_eos
from specdemo.methods.retrieval import Datastore

# W, N, G and the copy's length: the fastest measured on a 2-core CPU (`git show 4f4c763:docs/methods/jacobi.md`);
# cllm, decoded by lookahead, takes the same but a window of 1 (`cllm.WINDOW`)
WINDOW, NGRAM, CANDIDATES, COPY_LENGTH = 2, 3, 3, 6
MAX_RETRIEVED_BRANCHES = 8  # guesses from earlier answers a pass may verify, each after another next token


class NgramPool:
    """n-grams keyed by their first token; at most `per_key` continuations a key, newest first,
    and at most `max_keys` keys (the least recently touched key goes first)."""

    def __init__(self, n: int, per_key: int, max_keys: int = 4096):
        self.n, self.per_key, self.max_keys = n, per_key, max_keys
        self.entries: OrderedDict[int, list[tuple[int, ...]]] = OrderedDict()

    def __len__(self) -> int:
        return sum(len(continuations) for continuations in self.entries.values())

    def insert(self, ngram: Iterable[int]) -> None:
        first, *rest = ngram
        continuation = tuple(rest)
        if len(continuation) != self.n - 1:
            raise ValueError(f"an n-gram of this pool has {self.n} tokens, got {len(continuation) + 1}")
        continuations = [c for c in self.entries.pop(first, []) if c != continuation]
        self.entries[first] = [continuation, *continuations][: self.per_key]
        if len(self.entries) > self.max_keys:
            self.entries.popitem(last=False)

    def insert_text(self, tokens: list[int]) -> None:
        """Every n-gram of `tokens`, oldest first (so the newest ends up first)."""
        for start in range(len(tokens) - self.n + 1):
            self.insert(tokens[start : start + self.n])

    def lookup(self, first: int) -> list[tuple[int, ...]]:
        return list(self.entries.get(first, []))


def generate(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int = 128,
    sampling: SamplingConfig = GREEDY,
    window: int = WINDOW,
    ngram: int = NGRAM,
    candidates: int = CANDIDATES,
    text_ngrams: bool = True,
    copy_length: int = COPY_LENGTH,
    retrieve: bool = True,
    retrieved_branches: int = 1,
    datastore: Datastore | None = None,
    eos_token_ids: Iterable[int] | None = None,
    stop: threading.Event | None = None,
    method_name: str = "lookahead",
    passes: CompiledPass | None = None,
) -> Iterator[StepEvent | Summary]:
    """Decode after `input_ids` [1, L] with lookahead window W=`window`, n-gram size N=`ngram`
    and at most G=`candidates` verified candidates a pass (with `text_ngrams`, the first of
    them copied from the text, up to `copy_length` tokens long, and with `retrieve` the next
    `retrieved_branches` guessed as long from `datastore`, the target's earlier answers, each after
    another next token: `retrieval.Datastore.continuations`). The defaults are the fastest
    measured on a 2-core CPU (`git show 4f4c763:docs/methods/jacobi.md`); a GPU affords the paper's larger W, N, G,
    since a wider pass costs it little. `passes`: the model's compiled static pass (None: eager)."""
    check_greedy(sampling, method_name)
    for name, value, low, high in (("window", window, 1, 32), ("ngram", ngram, 2, 8), ("candidates", candidates, 0, 32),
                                   ("copy_length", copy_length, 1, 32),
                                   ("retrieved_branches", retrieved_branches, 1, MAX_RETRIEVED_BRANCHES)):
        check_whole(name, value, low, high)
    proposer = Lookahead(input_ids, window, ngram, candidates, copy_length if text_ngrams else 0,
                         datastore if retrieve else None, retrieved_branches)
    # A pass's root (the last committed token) is at least 1 before the request's last position,
    # and its window reaches W + N - 2 past the root: W + N - 3 past that position at most.
    reach = max(window + ngram - 3, 0)
    return decode(model, input_ids, proposer, method=method_name, max_new_tokens=max_new_tokens, sampling=sampling,
                  eos_token_ids=eos_token_ids, stop=stop, reach=reach, passes=passes)


@dataclass(frozen=True)
class Tried:
    """The candidates one pass verifies, each a chain from the root, and where each came from."""

    candidates: list[tuple[int, ...]]
    sources: list[str]


class Lookahead(Proposer):
    """Proposes the pool's n-grams (and a copy, and a guess from earlier answers) as chains from the
    root, with the Jacobi window as work nodes; learns a new window level and the n-grams down its columns."""

    def __init__(self, input_ids: torch.Tensor, window: int, ngram: int, candidates: int, copy_length: int,
                 datastore: Datastore | None = None, retrieved_branches: int = 1):
        self.window, self.ngram, self.limit, self.copy_length, self.datastore = (window, ngram, candidates, copy_length,
                                                                                 datastore)
        self.retrieved_branches = retrieved_branches
        self.pool = NgramPool(ngram, per_key=max(candidates, 1))
        if copy_length:  # text n-grams: the prompt's go into the pool too
            self.pool.insert_text(input_ids[0].tolist())
        self.levels = initial_window(input_ids, window, ngram - 1)  # [N - 1][W] Jacobi iterates, oldest first

    def propose(self, context: Context, sequence: torch.Tensor, room: int) -> Proposed:
        text = context.text.of(sequence)
        tried = Tried(*choose_candidates(self.pool, text, self.limit, self.copy_length, room - 1, self.datastore,
                                         context.eos, self.retrieved_branches))
        return Proposed(proposal(tried.candidates, tried.sources, self.levels), tried)

    def learn(self, context: Context, sequence: torch.Tensor, proposed: Proposed, verified: TargetPass,
              verdict: Verdict, kept: list[int], room: int) -> Learned:
        tried, sources = proposed.step.candidates, proposed.step.sources
        # the lookahead branch: a new level (the target's argmax after the last one, read with its verdict), and an
        # n-gram down each column
        new_level = verdict.read
        for column in range(self.window):
            self.pool.insert([level[column] for level in self.levels] + [new_level[column]])
        accept_lengths = candidate_accept_lengths(tried, verdict.path)
        best = candidate_of(tried, verdict.path[-1]) if verdict.path else 0
        accept_length = len(verdict.path)
        committed = len(verdict.path) + 1
        if self.copy_length:  # the n-grams that end in the tokens just committed
            self.pool.insert_text(context.text.of(sequence)[-(self.ngram + committed - 1) :].tolist())
        learned = Learned(
            rejected=list(tried[best][accept_length:]) if tried else [],
            data=LookaheadStep(
                window=self.levels,
                new_level=new_level,
                candidates=[list(c) for c in tried],
                candidate_sources=sources,
                candidate_accept_lengths=accept_lengths,
                best_candidate=best if tried else None,
                accept_length=accept_length,
                pool_size=len(self.pool),
            ),
        )
        self.levels = self.levels[1:] + [new_level]
        return learned


def initial_window(input_ids: torch.Tensor, window: int, levels: int) -> list[list[int]]:
    """The first window: tokens drawn from the prompt with a fixed seed (Fu et al. initialise
    from the prompt too; any start converges, this one is reproducible)."""
    generator = torch.Generator().manual_seed(0)
    prompt = input_ids[0].cpu()
    # CPU whatever the default device
    picks = torch.randint(len(prompt), (levels, window), generator=generator, device="cpu")
    return prompt[picks].tolist()


def proposal(tried: list[tuple[int, ...]], sources: list[str], levels: list[list[int]]) -> Proposal:
    """One pass's proposal: each candidate a chain from the root, then the window's levels as work
    nodes. Column c of level 0 follows column c - 1 (column 0 the root); column c of level l > 0
    follows column c of level l - 1. Each window token then sees level 0 up to its column and its
    column above it, at position c + l + 1 after the root (Fu et al. 2024, Fig. 3); the last level
    is read, for the next one."""
    tokens, parents, kinds = [], [], []
    for candidate, source in zip(tried, sources):
        parents += [-1 if j == 0 else len(tokens) + j - 1 for j in range(len(candidate))]
        tokens += candidate
        kinds += [source] * len(candidate)
    window_start, width = len(tokens), len(levels[0])
    for level, row in enumerate(levels):
        for column, token in enumerate(row):
            if level > 0:
                parents.append(window_start + (level - 1) * width + column)
            else:
                parents.append(-1 if column == 0 else window_start + column - 1)
            tokens.append(token)
            kinds.append("window")
    last_level = window_start + (len(levels) - 1) * width
    work = len(tokens) - window_start
    return Proposal(tuple(tokens), tuple(parents), tuple(kinds), work=work, read=tuple(range(last_level, len(tokens))))


def choose_candidates(
    pool: NgramPool, tokens: torch.Tensor | list[int], limit: int, copy_length: int, max_length: int | None = None,
    datastore: Datastore | None = None, eos: tuple[int, ...] = (), retrieved_branches: int = 1,
) -> tuple[list[tuple[int, ...]], list[str]]:
    """Up to `limit` continuations of the text's last token (`tokens` on the CPU) to verify, and where each came from:
    first a copy from the text (when `copy_length` > 0), then what `datastore` guesses as long
    (`retrieved_branches` guesses, each after another of the next tokens most earlier answers hold,
    up to an EOS: `retrieval.Datastore.continuations`),
    then the pool's n-grams, newest first, leaving out any that a longer candidate already starts
    with. Each is cut to `max_length` tokens (None: uncut): near the end of the answer, what could
    no longer be committed is not fed."""
    found = [(copy_from_text(tokens, copy_length), "copy")] if copy_length else []
    if copy_length and datastore is not None:
        found += [(tuple(until_eos(guess, eos)), "retrieved")
                  for guess in datastore.continuations(tokens, copy_length, retrieved_branches)]
    found += [(ngram, "pool") for ngram in pool.lookup(int(tokens[-1]))]
    found = [(candidate[:max_length], source) for candidate, source in found]
    chosen: list[tuple[tuple[int, ...], str]] = []
    for candidate, source in found:
        if candidate and not any(other[: len(candidate)] == candidate for other, _ in chosen):
            chosen.append((candidate, source))
    chosen = chosen[:limit]
    return [c for c, _ in chosen], [s for _, s in chosen]


def candidate_of(tried: list[tuple[int, ...]], node: int) -> int:
    """The candidate a proposal node belongs to (candidates are laid out one after another)."""
    start = 0
    for index, candidate in enumerate(tried):
        if node < start + len(candidate):
            return index
        start += len(candidate)
    raise ValueError(f"node {node} is past the candidates")


def candidate_accept_lengths(tried: list[tuple[int, ...]], path: list[int]) -> list[int]:
    """How many leading tokens of each candidate the target accepted: the accepted path's length
    on its own candidate; on another, as many as it shares with the path (the same tokens after
    the same root, so the same verdicts)."""
    if not tried:
        return []
    best = candidate_of(tried, path[-1]) if path else -1
    accepted = [t for i, candidate in enumerate(tried) if i == best for t in candidate[: len(path)]]
    lengths = []
    for candidate in tried:
        shared = 0
        while shared < min(len(candidate), len(accepted)) and candidate[shared] == accepted[shared]:
            shared += 1
        lengths.append(shared)
    return lengths
