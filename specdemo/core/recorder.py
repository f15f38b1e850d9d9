"""The bookkeeping every method shares: stop rules, pass counters, time, and event building.

A method decides which tokens a target pass commits; `StepRecorder.step` turns that into a
`StepEvent` after applying the stop rules in one place (an EOS token ends the answer, the
answer never exceeds max_new_tokens, a set stop signal ends it before the next pass).
"""

import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from specdemo.core.events import FinishReason, StepEvent, Summary
from specdemo.core.steps import Payload


class StepRecorder:
    def __init__(
        self,
        method: str,
        max_new_tokens: int,
        eos_token_ids: Iterable[int],
        stop: threading.Event | None = None,
    ):
        self.method = method
        self.max_new_tokens = max_new_tokens
        self.eos_token_ids = frozenset(eos_token_ids)
        self.stop = stop
        self.tokens: list[int] = []
        self.finish_reason: FinishReason | None = None
        self.target_forwards = 0
        self.draft_forwards = 0
        self.proposed = 0
        self.accepted = 0
        self.target_s = 0.0  # the target's passes
        self.start = time.perf_counter()

    @property
    def done(self) -> bool:
        """True once the answer is finished; checked before each target pass."""
        if self.finish_reason is None and self.stop is not None and self.stop.is_set():
            self.finish_reason = "stopped"
        return self.finish_reason is not None

    @property
    def room(self) -> int:
        """How many more tokens the answer may take."""
        return self.max_new_tokens - len(self.tokens)

    def step(
        self,
        committed: Sequence[int],
        proposed: Sequence[int] = (),
        accepted: Sequence[int] = (),
        rejected: Sequence[int] = (),
        draft_forwards: int = 0,
        data: Payload | None = None,
        target_s: float = 0.0,
    ) -> StepEvent:
        """Record one target pass that commits `committed` (accepted proposals first); the pass took `target_s`."""
        committed = self._apply_stop_rules(list(committed))
        self.target_s += target_s
        accepted = tuple(accepted)[: len(committed)]
        self.tokens += committed
        self.target_forwards += 1
        self.draft_forwards += draft_forwards
        self.proposed += len(proposed)
        self.accepted += len(accepted)
        return StepEvent(
            method=self.method,
            step=self.target_forwards - 1,
            committed=tuple(committed),
            proposed=tuple(proposed),
            accepted=accepted,
            rejected=tuple(rejected),
            target_forwards=self.target_forwards,
            draft_forwards=self.draft_forwards,
            elapsed_s=time.perf_counter() - self.start,
            data=data,
            target_s=target_s,
        )

    def kept(self, committed: Sequence[int]) -> list[int]:
        """What of `committed` the stop rules let into the answer; changes nothing. The length cut
        comes first: an EOS past it is never part of the answer, as with AR."""
        committed = list(committed[: self.room])
        ends = [index for index, token in enumerate(committed) if token in self.eos_token_ids]
        return committed[: ends[0] + 1] if ends else committed

    def room_after(self, kept: Sequence[int]) -> int:
        """How many more tokens the answer may take once `kept` (what `kept` let in of a pass's
        tokens) joins it: 0 where the stop rules end the answer there; changes nothing."""
        return 0 if kept and kept[-1] in self.eos_token_ids else self.room - len(kept)

    def _apply_stop_rules(self, committed: list[int]) -> list[int]:
        kept = self.kept(committed)
        if kept and kept[-1] in self.eos_token_ids:
            self.finish_reason = "eos"
        elif len(kept) == self.room:
            self.finish_reason = "length"
        return kept

    def summary(self, extra: dict[str, Any] | None = None) -> Summary:
        return Summary(
            method=self.method,
            tokens=tuple(self.tokens),
            finish_reason=self.finish_reason or "stopped",
            steps=self.target_forwards,
            target_forwards=self.target_forwards,
            draft_forwards=self.draft_forwards,
            proposed=self.proposed,
            accepted=self.accepted,
            elapsed_s=time.perf_counter() - self.start,
            extra=extra or {},
            target_s=self.target_s,
        )


def eos_token_ids_of(model, tokenizer=None) -> tuple[int, ...]:
    """Every token id that ends an answer: the generation config's EOS ids and the tokenizer's."""
    ids = getattr(model.generation_config, "eos_token_id", None)
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return tuple(dict.fromkeys(ids))


def resolve_eos(model, eos_token_ids: Iterable[int] | None) -> tuple[int, ...]:
    """The end-of-sequence ids of a generation: the caller's, else the model's."""
    return eos_token_ids_of(model) if eos_token_ids is None else tuple(eos_token_ids)
