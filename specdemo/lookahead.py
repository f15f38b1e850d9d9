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
then commit several tokens a pass.
"""

import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator

import torch
from transformers import DynamicCache, PreTrainedModel

from .attention import additive_mask, chain_positions, sees_from_parents
from .errors import SpecDemoError, check_request
from .events import StepEvent, Summary
from .jacobi import check_greedy, leading_matches
from .kvcache import keep_positions
from .models import eos_token_ids as model_eos_token_ids
from .prompt_lookup import copy_from_text
from .recorder import StepRecorder
from .sampling import GREEDY, SamplingConfig, TokenChooser


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


@torch.inference_mode()
def generate(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int = 128,
    sampling: SamplingConfig = GREEDY,
    window: int = 2,
    ngram: int = 3,
    candidates: int = 3,
    text_ngrams: bool = True,
    copy_length: int = 6,
    eos_token_ids: Iterable[int] | None = None,
    stop: threading.Event | None = None,
) -> Iterator[StepEvent | Summary]:
    """Decode after `input_ids` [1, L] with lookahead window W=`window`, n-gram size N=`ngram`
    and at most G=`candidates` verified candidates a pass (with `text_ngrams`, the first of
    them copied from the text, up to `copy_length` tokens long). The defaults are the fastest we measured
    on a 2-core CPU (README); a GPU affords the paper's larger W, N, G, since a wider pass costs it little."""
    check_greedy(sampling, "lookahead")
    for name, value, low, high in (("window", window, 1, 32), ("ngram", ngram, 2, 8), ("candidates", candidates, 0, 32), ("copy_length", copy_length, 1, 32)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise SpecDemoError(f"{name} must be a whole number from {low} to {high}, got {value!r}")
    # A pass's root (the last committed token) is at least 1 before the request's last position,
    # and its window reaches W + N - 2 past the root: W + N - 3 past that position at most.
    window_reach = max(window + ngram - 3, 0)
    check_request(input_ids, max_new_tokens, getattr(model.config, "max_position_embeddings", None), window_reach)
    eos = model_eos_token_ids(model) if eos_token_ids is None else tuple(eos_token_ids)
    recorder = StepRecorder("lookahead", max_new_tokens, eos, stop)
    choose = TokenChooser(sampling, input_ids.device)
    cache = DynamicCache(config=model.config)
    pool = NgramPool(ngram, per_key=max(candidates, 1))
    if text_ngrams:
        pool.insert_text(input_ids[0].tolist())
    levels = initial_window(input_ids, window, ngram - 1)
    sequence = input_ids  # [1, n] prompt + committed tokens; the cache holds all but the last
    while not recorder.done:
        cached = cache.get_seq_length()
        pending = sequence[0, cached:].tolist()  # committed tokens the cache has not seen
        tried, sources = choose_candidates(pool, sequence[0], candidates, copy_length if text_ngrams else 0, recorder.room - 1)
        layout = Layout(len(pending), [len(c) for c in tried], ngram - 1, window)
        fed = torch.tensor([pending + [t for c in tried for t in c] + [t for level in levels for t in level]], device=sequence.device)
        logits = model(
            fed,
            attention_mask=additive_mask(layout.sees.to(fed.device), cached, model.dtype),
            position_ids=chain_positions(layout.sees, cached).to(fed.device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=torch.tensor(layout.scored, device=fed.device),
        ).logits[0]  # rows: the last pending token, each candidate's tokens, the window's last level
        accept_lengths, choices = verify(choose, sequence, tried, logits[: layout.window_start - len(pending) + 1])
        best = max(range(len(tried)), key=lambda g: accept_lengths[g]) if tried else 0
        accept_length = accept_lengths[best] if tried else 0
        accepted = list(tried[best][:accept_length]) if tried else []
        committed = [*accepted, choices[best][accept_length]]
        # the lookahead branch: a new level, and one n-gram down each column of the window
        new_level = logits[layout.window_start - len(pending) + 1 :].argmax(dim=-1).tolist()
        for column in range(window):
            pool.insert([level[column] for level in levels] + [new_level[column]])
        keep_positions(cache, cached + len(pending), layout.candidate_positions(best, accept_length, cached))
        sequence = torch.cat([sequence, torch.tensor([committed], device=sequence.device)], dim=-1)
        if text_ngrams:  # the n-grams that end in the tokens just committed
            pool.insert_text(sequence[0, -(ngram + len(committed) - 1) :].tolist())
        yield recorder.step(
            committed=committed,
            proposed=[t for c in tried for t in c],
            accepted=accepted,
            rejected=list(tried[best][accept_length:]) if tried else [],
            extra={
                "window": levels,
                "new_level": new_level,
                "candidates": [list(c) for c in tried],
                "candidate_sources": sources,
                "candidate_accept_lengths": accept_lengths,
                "best_candidate": best if tried else None,
                "accept_length": accept_length,
                "pool_size": len(pool),
            },
        )
        levels = levels[1:] + [new_level]
    yield recorder.summary()


def initial_window(input_ids: torch.Tensor, window: int, levels: int) -> list[list[int]]:
    """The first window: tokens drawn from the prompt with a fixed seed (Fu et al. initialise
    from the prompt too; any start converges, this one is reproducible)."""
    generator = torch.Generator().manual_seed(0)
    prompt = input_ids[0].cpu()
    picks = torch.randint(len(prompt), (levels, window), generator=generator)
    return prompt[picks].tolist()


class Layout:
    """Where each token of a lookahead pass sits, and what it sees.

    Fed order: `pending` committed tokens, then the candidates (continuations of the last
    pending token, `candidate_lengths` tokens each), then the window: `levels` rows of `window` tokens."""

    def __init__(self, pending: int, candidate_lengths: list[int], levels: int, window: int):
        self.pending, self.window = pending, window
        self.candidate_starts = []  # index of each candidate's first token in the fed order
        parents = [i - 1 for i in range(pending)]  # -1: the cached prefix
        for length in candidate_lengths:
            start = len(parents)
            self.candidate_starts.append(start)
            parents += [pending - 1 if j == 0 else start + j - 1 for j in range(length)]
        self.window_start = len(parents)
        for level in range(levels):
            for column in range(window):
                if level > 0:
                    parents.append(self.window_start + (level - 1) * window + column)
                else:
                    parents.append(pending - 1 if column == 0 else self.window_start + column - 1)
        self.sees = sees_from_parents(parents)  # [q, q]
        last_level = self.window_start + (levels - 1) * window
        self.scored = [pending - 1, *range(pending, self.window_start), *range(last_level, last_level + window)]

    def candidate_positions(self, best: int, accept_length: int, cached: int) -> list[int]:
        """Cache positions of the accepted tokens of candidate `best`."""
        start = cached + self.candidate_starts[best] if self.candidate_starts else cached
        return list(range(start, start + accept_length))


def choose_candidates(
    pool: NgramPool, tokens: torch.Tensor | list[int], limit: int, copy_length: int, max_length: int | None = None
) -> tuple[list[tuple[int, ...]], list[str]]:
    """Up to `limit` continuations of the text's last token to verify, and where each came from:
    first a copy from the text (when `copy_length` > 0), then the pool's n-grams, newest first,
    leaving out any that a longer candidate already starts with. Each is cut to `max_length`
    tokens (None: uncut): near the end of the answer, what could no longer be committed is not fed."""
    found = [(copy_from_text(tokens, copy_length), "copy")] if copy_length else []
    found += [(ngram, "pool") for ngram in pool.lookup(int(tokens[-1]))]
    found = [(candidate[:max_length], source) for candidate, source in found]
    chosen: list[tuple[tuple[int, ...], str]] = []
    for candidate, source in found:
        if candidate and not any(other[: len(candidate)] == candidate for other, _ in chosen):
            chosen.append((candidate, source))
    chosen = chosen[:limit]
    return [c for c, _ in chosen], [s for _, s in chosen]


def verify(choose: TokenChooser, sequence: torch.Tensor, tried: list[tuple[int, ...]], logits: torch.Tensor):
    """Greedy exact-match verification of each candidate: its accept length, and the target's
    choices along it (choices[g][i]: the target's token after the candidate's first i tokens).
    `logits` rows: the last committed token, then each candidate's tokens in turn."""
    if not tried:
        return [], [choose.greedy_choices(sequence, logits[:1]).tolist()]
    accept_lengths, choices, row = [], [], 1
    for candidate in tried:
        rows = torch.cat([logits[:1], logits[row : row + len(candidate)]])  # [len(candidate) + 1, V]
        row += len(candidate)
        path = torch.cat([sequence, torch.tensor([candidate], device=sequence.device)], dim=-1)
        path_choices = choose.greedy_choices(path, rows).tolist()
        accept_lengths.append(leading_matches(list(candidate), path_choices))
        choices.append(path_choices)
    return accept_lengths, choices
