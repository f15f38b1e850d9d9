"""Prompt lookup (Saxena 2023): guess the next tokens by copying what followed the text's end before.

Answers that quote their input (summaries, answers from a passage, code edits, lists that repeat
a pattern) continue an earlier stretch of the prompt or of the answer itself. Lookahead
decoding verifies such a copy beside its pool's n-grams; speculative decoding hangs it as one
more branch of the draft tree, Medusa beside its heads' tree. It costs no model pass, only a
wider verification pass.
"""

import numpy as np
import torch

from specdemo.core.errors import check_whole

# tokens a tree's copied branch may hold: the best of 0 to 16 for
# speculative on our bench prompts (`git show 4f4c763:docs/methods/speculative.md`)
COPY_LENGTH = 8
# copy only after a repeat of at least 2 tokens: after 1, the copy is rarely right and widens the pass
SHORTEST_MATCH = 2
MAX_COPY_LENGTH = 16


def check_copy_length(copy_length: int | None) -> int:
    """The copied branch's length for a `copy_length` setting: None means COPY_LENGTH, 0 none."""
    if copy_length is None:
        return COPY_LENGTH
    return check_whole("copy_length", copy_length, 0, MAX_COPY_LENGTH, "tokens copied from the text into the tree")


def copy_from_text(tokens: torch.Tensor | np.ndarray | list[int], length: int, longest_match: int = 3,
                   shortest_match: int = 1) -> tuple[int, ...]:
    """The up to `length` tokens that followed the latest earlier occurrence of the text's last
    k tokens (`tokens` [n]), trying k = `longest_match` down to `shortest_match`; () when none
    occurred. Each k is k comparisons of every earlier k-gram's tokens with the suffix's, not a Python
    loop over the text: this runs before every pass. `tokens` lie on the CPU (a proposer copies
    a text on a GPU once a pass), read as a numpy array, whose small operations cost the host
    less than torch's."""
    tokens = tokens.numpy() if isinstance(tokens, torch.Tensor) else np.asarray(tokens)
    n = tokens.shape[0]
    for k in range(min(longest_match, n - 1), shortest_match - 1, -1):
        matches = tokens[: n - k] == tokens[n - k]  # where each earlier k-gram starts, if its first token matches ...
        for j in range(1, k):
            matches &= tokens[j : n - k + j] == tokens[n - k + j]  # ... and its j-th
        starts = np.flatnonzero(matches)
        if len(starts):
            follow = int(starts[-1]) + k
            return tuple(tokens[follow : follow + length].tolist())
    return ()


def copied_branch(tokens: torch.Tensor | np.ndarray | list[int], length: int, eos: tuple[int, ...]) -> list[int]:
    """The branch a tree gets from the text `tokens`: up to `length` tokens copied after a repeat
    of at least SHORTEST_MATCH tokens, up to and including an EOS (nothing is proposed past the
    end of an answer)."""
    return until_eos(copy_from_text(tokens, length, shortest_match=SHORTEST_MATCH) if length > 0 else (), eos)


def until_eos(tokens: tuple[int, ...] | list[int], eos: tuple[int, ...]) -> list[int]:
    """`tokens` up to and including the first EOS."""
    ends = [i for i, token in enumerate(tokens) if token in eos]
    return list(tokens[: ends[0] + 1] if ends else tokens)
