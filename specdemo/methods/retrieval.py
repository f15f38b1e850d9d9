"""Retrieval (REST, He et al. 2024): guess the next tokens from what followed the text's end in a
datastore of earlier answers.

Prompt lookup (`prompt_lookup`) copies from the text itself; a datastore holds the target's own
greedy answers to thousands of other prompts, so the phrases it keeps writing ("Here are some
tips:", a worked step of arithmetic, the closing sentence of a letter) can be guessed in an
answer that has not written them yet. Like a copy it costs no model pass, only a wider
verification pass, and like every guess it is verified: the answer stays the target's.

The datastore is a list of answers (token ids). Its index sorts every position by the K tokens
from it packed into one 64-bit key (K = 64 // bits per token: 4 for a vocabulary under 65,535),
so the positions after any k <= K tokens are one contiguous run of keys. A guess takes the
longest suffix of the text (K down to SHORTEST_MATCH tokens) that occurs in the datastore and
follows its occurrences, token by token, down the continuation most of them share. REST keeps a
trie of the continuations and verifies its likeliest branches; a tree here takes one, and
lookahead's candidates may take several (`continuations`: one for each of the likeliest next
tokens, `lookahead.generate`'s `retrieved_branches`).
"""

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from specdemo.core.errors import SpecDemoError
from specdemo.methods.prompt_lookup import copied_branch, until_eos

TOKENS_FILE, CONFIG_FILE = "answers.npy", "datastore.json"
SHORTEST_MATCH = 2  # as for prompt lookup: after a single token the guess is rarely right
MOST_OCCURRENCES = 256  # a suffix seen more often is followed in this many of its occurrences, spread evenly


class Datastore:
    """The answers in `tokens` (token ids below `vocab_size`, each answer followed by `vocab_size`,
    as `save` writes them; `of_answers` makes them from lists), indexed for `continuation`."""

    def __init__(self, tokens: np.ndarray, vocab_size: int):
        self.vocab_size = vocab_size
        self.end = vocab_size  # the token that ends every answer in `tokens`: no guess runs past it
        self.bits = vocab_size.bit_length()  # enough for every token and `end`
        self.width = 64 // self.bits  # K: tokens a key holds
        if self.width < SHORTEST_MATCH:
            raise SpecDemoError(f"a datastore needs at least {SHORTEST_MATCH} tokens a 64-bit key: a vocabulary of "
                                f"{vocab_size} is too large")
        self.tokens = np.asarray(tokens, dtype=np.int64)  # [n]
        if len(self.tokens) and (self.tokens.min() < 0 or self.tokens.max() > self.end or self.tokens[-1] != self.end):
            raise SpecDemoError(f"a datastore holds a token outside the vocabulary of {vocab_size}, or does not end an "
                                "answer")
        self.answers = int((self.tokens == self.end).sum())
        padded = np.concatenate([self.tokens, np.full(self.width, self.end)])
        keys = np.zeros(len(self.tokens), dtype=np.uint64)
        for offset in range(self.width):  # the first token in the highest bits
            keys = (keys << np.uint64(self.bits)) | padded[offset : offset + len(self.tokens)].astype(np.uint64)
        starts = np.nonzero(self.tokens != self.end)[0]
        order = np.argsort(keys[starts], kind="stable")
        self.keys, self.starts = keys[starts][order], starts[order]  # sorted keys; where each key's tokens start

    @classmethod
    def of_answers(cls, answers: Sequence[Sequence[int]], vocab_size: int) -> "Datastore":
        """The datastore of `answers`, lists of token ids below `vocab_size`."""
        pieces = []
        for answer in answers:
            answer = np.asarray(answer, dtype=np.int64)
            if answer.size and (answer.min() < 0 or answer.max() >= vocab_size):
                raise SpecDemoError(f"a datastore answer holds a token outside the vocabulary of {vocab_size}")
            pieces += [answer, np.array([vocab_size])]
        return cls(np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64), vocab_size)

    def occurrences(self, suffix: Sequence[int]) -> np.ndarray:
        """Where the tokens just after each occurrence of `suffix` (at most K tokens) start."""
        k = len(suffix)
        key = 0
        for token in suffix:
            key = (key << self.bits) | int(token)
        shift = (self.width - k) * self.bits
        low, high = key << shift, (key + 1) << shift
        first = int(np.searchsorted(self.keys, np.uint64(low)))
        last = len(self.keys) if high >= 1 << 64 else int(np.searchsorted(self.keys, np.uint64(high)))
        return self.starts[first:last] + k

    def holds(self, run: Sequence[int]) -> bool:
        """Whether `run` (at least K tokens) occurs in one of the answers, token for token."""
        starts = self.occurrences(run[: self.width]) - self.width
        run = np.asarray(run, dtype=np.int64)
        return any(np.array_equal(self.tokens[start : start + len(run)], run) for start in starts)

    def shared_windows(self, answer: Sequence[int], width: int = 16) -> float:
        """The share of `answer`'s runs of `width` tokens that occur in the datastore: near 0 for
        an answer the target never wrote before, near 1 for one it holds (a prompt whose gain
        would be recall, not prediction)."""
        windows = [answer[i : i + width] for i in range(len(answer) - width + 1)]
        return sum(self.holds(window) for window in windows) / len(windows) if windows else 0.0

    def continuation(self, text: Sequence[int], length: int, least_share: float = 0.0) -> tuple[int, ...]:
        """Up to `length` tokens guessed after `text`: the first of `continuations`, the one most
        occurrences of its longest suffix share; () when there is none."""
        return next(iter(self.continuations(text, length, 1, least_share)), ())

    def continuations(self, text: Sequence[int], length: int, branches: int = 1,
                      least_share: float = 0.0) -> list[tuple[int, ...]]:
        """Up to `branches` guesses of up to `length` tokens after `text`, one for each of the tokens
        that most occurrences of its longest suffix found here (K down to SHORTEST_MATCH tokens)
        continue with, most first (ties: the smaller token id), none that ends an answer or that
        fewer than `least_share` of them continue with. Each goes on one token at a time among the
        occurrences that agreed so far, with what most of them continue with, stopping where fewer
        than `least_share` of them agree on it. No guess when no suffix occurs or `length` is 0."""
        follow = self.following(text) if length > 0 else None
        if follow is None:
            return []
        if branches == 1:  # the guess most occurrences share: its first token is walked as the rest are
            guess = self.agreed(follow, length, least_share)
            return [guess] if guess else []
        firsts = self.tokens[follow]
        if (firsts == firsts[0]).all():  # the occurrences agree, as they mostly do: no need to count
            values, counts = firsts[:1], np.array([len(firsts)])
        else:
            values, counts = np.unique(firsts, return_counts=True)
        guesses = []
        for best in np.argsort(-counts, kind="stable")[:branches]:
            token = int(values[best])
            if token != self.end and counts[best] >= least_share * len(follow):
                guesses.append((token, *self.agreed(follow[firsts == token] + 1, length - 1, least_share)))
        return guesses

    def following(self, text: Sequence[int]) -> np.ndarray | None:
        """Where the tokens after the occurrences of `text`'s longest suffix that occurs here start
        (at most MOST_OCCURRENCES of them, taken evenly); None when none occurs."""
        text = text[-self.width :]
        text = text.tolist() if hasattr(text, "tolist") else [int(token) for token in text]  # not one a token
        if any(token >= self.vocab_size or token < 0 for token in text):
            return None
        for k in range(min(self.width, len(text)), SHORTEST_MATCH - 1, -1):
            follow = self.occurrences(text[len(text) - k :])
            if len(follow):
                break
        else:
            return None
        # keys sort the occurrences by what follows them: take them evenly, not the first ones
        if len(follow) > MOST_OCCURRENCES:
            follow = follow[np.linspace(0, len(follow) - 1, MOST_OCCURRENCES).round().astype(np.int64)]
        return follow

    def agreed(self, follow: np.ndarray, length: int, least_share: float) -> tuple[int, ...]:
        """Up to `length` tokens from the occurrences' next tokens at `follow`: each the one most of
        them hold (ties: the smallest token id), until one ends an answer or fewer than `least_share`
        of them hold it; those that hold it go on."""
        guessed = []
        for _ in range(length):
            following = self.tokens[follow]
            agree = following == following[0]
            if agree.all():  # the occurrences agree so far, as they mostly do: no need to count
                token, count = int(following[0]), len(following)
            else:
                values, counts = np.unique(following, return_counts=True)
                best = counts.argmax()
                token, count = int(values[best]), counts[best]  # ties: the smallest token id
                agree = following == token
            if token == self.end or count < least_share * len(follow):
                break
            guessed.append(token)
            follow = follow[agree] + 1
        return tuple(guessed)

    def save(self, folder: Path, about: dict | None = None) -> None:
        """`folder`/answers.npy (the answers, each ended by the vocabulary size) and datastore.json."""
        folder.mkdir(parents=True, exist_ok=True)
        dtype = np.uint16 if self.end < 1 << 16 else np.uint32
        np.save(folder / TOKENS_FILE, self.tokens.astype(dtype), allow_pickle=False)
        config = {"vocab_size": self.vocab_size, "answers": self.answers,
                  "tokens": int(len(self.tokens) - self.answers), **(about or {})}
        (folder / CONFIG_FILE).write_text(json.dumps(config, indent=1) + "\n")


def guessed_branch(text: Sequence[int], length: int, eos: tuple[int, ...], datastore: Datastore | None,
                   least_share: float = 0.0) -> tuple[list[int], str]:
    """A tree's branch of up to `length` tokens guessed without a model pass after `text`, and
    where it came from: copied from the text where its end occurred before ("copy", prompt
    lookup), else the datastore's continuation ("retrieved", `Datastore.continuation` with
    `least_share`); up to and including an EOS. `text` lies on the CPU (a proposer copies a text
    on a GPU once a pass)."""
    copied = copied_branch(text, length, eos)
    if copied or datastore is None:
        return copied, "copy"
    return until_eos(datastore.continuation(text, length, least_share), eos), "retrieved"


def answers_of(tokens: np.ndarray, end: int) -> list[np.ndarray]:
    """The answers in a flat array where each is followed by `end` (as `Datastore.save` writes them)."""
    cuts = np.nonzero(tokens == end)[0]
    return [tokens[start:stop] for start, stop in zip([0, *(cuts[:-1] + 1)], cuts)]


def load_datastore(folder: str | Path, vocab_size: int) -> Datastore:
    """The datastore saved in `folder`, for a target of `vocab_size` tokens (the same tokenizer's),
    loaded and indexed (the target's companions hold it once loaded: `methods.method_options`)."""
    folder = Path(folder)
    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
        tokens = np.load(folder / TOKENS_FILE, allow_pickle=False).astype(np.int64)
    except (OSError, ValueError) as error:
        raise SpecDemoError(f"cannot read a datastore from {folder}: {error}") from error
    if config["vocab_size"] != vocab_size:
        raise SpecDemoError(f"the datastore in {folder} holds answers of a {config['vocab_size']}-token vocabulary, "
                            f"the target has {vocab_size}")
    return Datastore(tokens, vocab_size)
