"""The step-event protocol: what every decoding method yields, once per target forward pass.

A method is a generator. Each pass of the target model produces one `StepEvent`; when the
method stops it yields one `Summary` and returns. The streaming UI, the step-through mode,
the benchmark and the tests all read these objects and nothing else, so a method never has
to be reached into.

    for item in ar.generate(model, input_ids, max_new_tokens=64):
        if isinstance(item, StepEvent): ...   # item.committed grew the answer by these tokens
        else: summary = item                  # totals and finish_reason

StepEvent fields
    method           the method's name ("ar", "speculative", ...)
    step             0-based index of the target forward pass (the prefill is step 0)
    committed        token ids appended to the answer by this pass, in order (after the
                     stop rules: cut after an EOS token and at max_new_tokens)
    proposed         token ids offered to this pass for verification (a draft, a flattened
                     tree, a Jacobi block); empty for plain autoregressive decoding
    accepted         the proposed tokens the target accepted, in commit order; they are the
                     first len(accepted) tokens of `committed`
    rejected         the proposed tokens the target threw away
    target_forwards  target forward passes so far, this one included
    draft_forwards   draft-model forward passes so far (0 for methods without a draft)
    elapsed_s        seconds since the method started (prompt ready) until this event
    target_s         seconds of this step spent in the target's pass (until its logits were
                     ready); the rest of the step is proposing, accepting and bookkeeping
    data             what the method tells about this pass, a typed payload of `specdemo.core.steps`
                     (a TreeStep, a JacobiStep, a LookaheadStep, the p / q numbers of a
                     SamplingCheck...); None for AR

The committed tokens that are not accepted proposals come from the target itself (its
correction or bonus token, or simply its next token in AR).

Summary fields: method, tokens (the whole answer), finish_reason ("eos": an end-of-sequence
token was committed; "length": max_new_tokens reached; "stopped": the caller's stop signal),
steps, target_forwards, draft_forwards, proposed and accepted (totals), elapsed_s, target_s (the
target's passes, in total), extra.

A new kind of pass adds a payload class to `specdemo.core.steps`; these classes never fork.
"""

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from specdemo.core.steps import JacobiStep, LookaheadStep, Payload, TreeStep

FinishReason = Literal["eos", "length", "stopped"]


@dataclass(frozen=True)
class StepEvent:
    """What one target forward pass did (see the module docstring)."""

    method: str
    step: int
    committed: tuple[int, ...]
    proposed: tuple[int, ...] = ()
    accepted: tuple[int, ...] = ()
    rejected: tuple[int, ...] = ()
    target_forwards: int = 0
    draft_forwards: int = 0
    elapsed_s: float = 0.0
    data: Payload | None = None
    target_s: float = 0.0


    def as_dict(self) -> dict:
        """The event as plain data (JSON-ready), its payload's kind named in `kind`."""
        return {**asdict(self), "kind": type(self.data).__name__ if self.data is not None else None}


@dataclass(frozen=True)
class Summary:
    """Totals of one generation, yielded last (see the module docstring)."""

    method: str
    tokens: tuple[int, ...]
    finish_reason: FinishReason
    steps: int
    target_forwards: int
    draft_forwards: int = 0
    proposed: int = 0
    accepted: int = 0
    elapsed_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    target_s: float = 0.0

    @property
    def tokens_per_forward(self) -> float:
        """Answer tokens per target forward pass: 1.0 for AR, more when proposals are accepted."""
        return len(self.tokens) / max(self.target_forwards, 1)

    @property
    def acceptance_rate(self) -> float:
        """Share of proposed tokens that the target accepted (0.0 when nothing was proposed)."""
        return self.accepted / self.proposed if self.proposed else 0.0


def final_summary(events: Iterable[StepEvent | Summary]) -> Summary:
    """Run a method's event stream to its end and return its Summary."""
    summary = None
    for item in events:
        if isinstance(item, Summary):
            summary = item
    if summary is None:
        raise RuntimeError("the event stream ended without a Summary")
    return summary


def acceptance_by_position(events: list[StepEvent]) -> list[float]:
    """Per draft position i, the share of the steps that proposed it in which it was accepted
    (for a draft tree, position i is depth i + 1: a tree proposes several tokens there)."""
    proposed, accepted = [], []
    for event in events:
        depth = max(event.data.tree.depths, default=0) if isinstance(event.data, TreeStep) else len(event.proposed)
        for i in range(depth):
            if i == len(proposed):
                proposed.append(0)
                accepted.append(0)
            proposed[i] += 1
            accepted[i] += i < len(event.accepted)
    return [a / p for a, p in zip(accepted, proposed)]


def guesses_by_source(events: Iterable[StepEvent | Summary]) -> dict[str, dict[str, list[int]]]:
    """Where the guessed tokens a method fed came from, and which of them the target accepted:
    per source ("draft", "head", "copy", "retrieved"; lookahead's "copy", "retrieved", "pool" and
    its Jacobi "window"), `fed` and `accepted` counts by depth (index 0: a token right after the
    root). A token fed costs a wider pass whether it is accepted or not, so this says which guesses
    pay for their width. Trees (speculative's, Medusa's) and lookahead's passes; others add nothing."""
    counts: dict[str, dict[str, list[int]]] = {}

    def count(source: str, depth: int, accepted: bool) -> None:
        row = counts.setdefault(source, {"fed": [], "accepted": []})
        while len(row["fed"]) < depth:
            row["fed"].append(0)
            row["accepted"].append(0)
        row["fed"][depth - 1] += 1
        row["accepted"][depth - 1] += accepted

    for event in events:
        data = event.data if isinstance(event, StepEvent) else None
        if isinstance(data, TreeStep):
            on_path = set(data.accepted_path)
            for node, (source, depth) in enumerate(zip(data.tree.sources, data.tree.depths)):
                count(source, depth, node in on_path)
        elif isinstance(data, LookaheadStep):
            # column c of level l sits c + l + 1 after the last committed token
            for age, level in enumerate(data.window):
                for column in range(len(level)):
                    count("window", column + age + 1, False)
            for index, (candidate, source) in enumerate(zip(data.candidates, data.candidate_sources)):
                for depth in range(1, len(candidate) + 1):
                    count(source, depth, index == data.best_candidate and depth <= data.accept_length)
    return counts


# where a committed token came from, as the page groups them: memory (the datastore of earlier
# answers, the text itself) apart from prediction (a draft, heads, a Jacobi window or pool)
ORIGINS = {"retrieved": "datastore", "copy": "text", "draft": "prediction", "head": "prediction", "pool": "prediction",
           "window": "prediction", "jacobi": "prediction"}


def committed_by_origin(events: Iterable[StepEvent | Summary]) -> dict[str, int]:
    """How many committed tokens came from each origin: "datastore" (retrieved from earlier
    answers), "text" (copied from the prompt or the answer so far), "prediction" (a draft, heads,
    a Jacobi block or lookahead's pool) and "target" (the token each pass adds of its own). The
    counts add up to the committed tokens; a guess is counted where its proposer says it came from
    (a tree node's source, a lookahead candidate's), a chain's or a Jacobi block's as prediction."""
    counts = {"datastore": 0, "text": 0, "prediction": 0, "target": 0}
    for event in events:
        if not isinstance(event, StepEvent):
            continue
        accepted = min(len(event.accepted), len(event.committed))
        for source in accepted_sources(event)[:accepted]:
            counts[ORIGINS.get(source, "prediction")] += 1
        counts["target"] += len(event.committed) - accepted
    return counts


def accepted_sources(event: StepEvent) -> list[str]:
    """The source of each accepted token of `event`, in commit order."""
    data = event.data
    if isinstance(data, TreeStep):
        return [data.tree.sources[node] for node in data.accepted_path]
    if isinstance(data, LookaheadStep) and data.best_candidate is not None:
        return [data.candidate_sources[data.best_candidate]] * len(event.accepted)
    return ["jacobi" if isinstance(data, JacobiStep) else "draft"] * len(event.accepted)
