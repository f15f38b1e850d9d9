"""The one exception SpecDemo raises for bad input, and the checks that raise it.

Every request is checked here before any tensor work, so a person gets a sentence
that says what to change instead of a shape error from deep inside a model.
"""

import torch

MAX_NEW_TOKENS_LIMIT = 4096


class SpecDemoError(ValueError):
    """A request SpecDemo cannot serve: an empty prompt, an unknown method, a bad setting..."""


def in_one_line(error: BaseException) -> str:
    """Why something failed, in one line: the error's kind and its message's first line (a report's
    row, a line of a table, where a traceback goes to stderr beside it)."""
    return f"{type(error).__name__}: {error}".splitlines()[0]


def described(error: BaseException) -> str:
    """Why something failed, its first line `in_one_line` and then that of each error it was raised
    from or while handling (a CUDA graph whose capture fails ends in CUDA's own error, "operation
    failed due to a previous error during capture", which names nothing of the first), its other
    lines the rest of the error's message (a compiler's)."""
    chain, cause = [error], error.__cause__ or error.__context__
    while cause is not None and len(chain) < 4:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    return "\n".join(["; during ".join(map(in_one_line, chain)), *str(error).splitlines()[1:]])


def check_request(input_ids: torch.Tensor, max_new_tokens: int, context_length: int | None,
                  lookahead_positions: int = 0) -> int:
    """Check a prompt of token ids [1, L] and a token budget; return the prompt length L.
    `lookahead_positions`: how far past the request's last position a method's passes feed
    tokens that are never committed (lookahead's window), which must fit the context too."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise SpecDemoError("the prompt must be a tensor of token ids of shape [1, length] (one prompt at a time)")
    prompt_length = input_ids.shape[1]
    if prompt_length == 0:
        raise SpecDemoError("the prompt is empty: type something for the model to answer")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise SpecDemoError(f"max_new_tokens must be a whole number, got {max_new_tokens!r}")
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
        raise SpecDemoError(f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS_LIMIT}, got {max_new_tokens}")
    if context_length is not None and prompt_length + max_new_tokens > context_length:
        raise SpecDemoError(
            f"the prompt ({prompt_length} tokens) plus max_new_tokens ({max_new_tokens}) exceeds the model's "
            f"context of {context_length} tokens: shorten the prompt or ask for fewer new tokens"
        )
    if context_length is not None and prompt_length + max_new_tokens + lookahead_positions > context_length:
        raise SpecDemoError(
            f"the lookahead window reaches {lookahead_positions} positions past the answer's last token, past the "
            f"model's context of {context_length} tokens: ask for at most "
            f"{context_length - prompt_length - lookahead_positions} new tokens, or choose a smaller window or n-gram "
            "size"
        )
    return prompt_length


def check_whole(name: str, value, low: int, high: int | None = None, what: str = "") -> int:
    """`value` if it is a whole number from `low` to `high` (None: no upper bound), else a sentence
    naming the setting; `what` says what it is. True and 2.0 are not whole numbers here."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        span = f"from {low}" if high is None else f"from {low} to {high}"
        raise SpecDemoError(f"{name}{f' ({what})' if what else ''} must be a whole number {span}, got {value!r}")
    return value
