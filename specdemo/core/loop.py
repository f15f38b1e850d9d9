"""The decoding loop, written once: propose, verify, accept, commit, learn; one event a target pass.

Every method that decodes by verifying proposals (speculative, Medusa, lookahead, Jacobi and
CLLM) is a `Proposer` in this loop, and AR is the proposer of nothing. A proposer says what to
check (`propose`, which returns the proposal with its own record of the pass: `Proposed`), may
bring its own acceptance rule (`accept`: the default is greedy, or a sample from the target when
nothing is proposed) and updates its state from the verdict (`learn`: a draft's cache, an n-gram
pool, a Jacobi block), returning what its event shows. What a pass proposed, and why, travels
through the loop from `propose` to `accept` and `learn`; what a proposer keeps across passes
only `learn` changes.
The loop owns the target's KV cache, the stop rules (`recorder.StepRecorder`) and the events
(`events.StepEvent`); a proposer never touches the target's cache. Beam search and contrastive
decoding keep loops of their own: they optimise other objectives than the target's greedy path.
"""

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from specdemo.core.errors import SpecDemoError, check_request
from specdemo.core.events import StepEvent, Summary
from specdemo.core.recorder import StepRecorder, resolve_eos
from specdemo.core.sampling import SamplingConfig, TokenChooser
from specdemo.core.static import CompiledPass, padded_width, request_cache
from specdemo.core.steps import Payload
from specdemo.core.transfer import HostText, tensor_on
from specdemo.core.verify import (
    EMPTY,
    Proposal,
    TargetPass,
    accept_greedy,
    choices_after,
    commit,
    read_with_choices,
    target_pass,
)


@dataclass(frozen=True)
class Context:
    """What a proposer may read about the generation it serves."""

    model: PreTrainedModel  # the target
    choose: TokenChooser  # the decoding rule and its seeded generator
    eos: tuple[int, ...]  # end-of-sequence token ids
    device: torch.device  # the target's (read once: a model's `device` walks its parameters)
    # compiled path: the width a pass of n fed tokens runs at (None: eager, n)
    bucket: Callable[[int], int] | None = None
    # the host's copy of the text, for the proposers whose guesses read it; the loop grows it as it grows the text
    text: HostText = field(default_factory=HostText)


@dataclass(frozen=True)
class Proposed:
    """What `propose` returns: the proposal the target checks, and the proposer's own record of
    this pass (what it proposed and why: a draft tree, a sampled chain's q, the candidates tried),
    which the loop hands to `accept` and `learn`; None where the proposal says it all."""

    proposal: Proposal
    step: Any = None


NOTHING = Proposed(EMPTY)


@dataclass
class Verdict:
    """What a target pass accepted: the path of proposal nodes and the target's own token after it."""

    path: list[int]
    token: int
    details: dict = field(default_factory=dict)  # the rule's numbers, for the event (p, q, thresholds...)
    read: list[int] = field(default_factory=list)  # the target's choice after each read work node (`Proposal.read`)
    # the proposal as its tokens were read with the target's choices, where they stayed on the device
    # (`Proposal.on_device`): what `learn` and the event see
    proposal: Proposal | None = None


@dataclass
class Learned:
    """What a proposer's event shows beyond the tokens: the proposed tokens the target turned down,
    the draft's passes this step, and the method's payload (`specdemo.core.steps`)."""

    rejected: list[int] = field(default_factory=list)
    draft_passes: int = 0
    data: Payload | None = None


class Proposer:
    """A method's strategy. The base class proposes nothing: that is AR.

    A proposer's attributes are its settings and the state it keeps across passes (a draft's
    cache, an n-gram pool, a Jacobi block, an adaptive γ), which only `learn` changes; what one
    pass proposed travels in `Proposed.step`. A draft's cache is made with its proposer, and
    drafting feeds it past what it keeps: `learn` rolls it back to what the target kept."""

    # True: the pass returns the target's last hidden states too (`verify.TargetPass.hidden`);
    # layers: theirs before them
    features: bool | tuple[int, ...] = False

    def propose(self, context: Context, sequence: torch.Tensor, room: int) -> Proposed:
        """The tokens to verify after `sequence` [1, n]; at most `room` more tokens may be committed."""
        return NOTHING

    def accept(self, context: Context, sequence: torch.Tensor, proposed: Proposed, verified: TargetPass) -> Verdict:
        """Greedy acceptance (exactly AR's answer); with nothing proposed, the target's next token
        by the decoding rule, sampled when sampling. A proposal whose tokens are on the device (plain
        greedy decoding) is read with the choices."""
        proposal = proposed.proposal
        if context.choose.config.do_sample:
            if proposal.size:
                raise SpecDemoError("this method verifies its proposals greedily: turn sampling off, or choose ar or "
                                    "speculative to sample")
            return Verdict([], int(context.choose(sequence, verified.logits[:1])))
        if proposal.on_device is not None:
            proposal, choices = read_with_choices(proposal, verified.logits)
            return Verdict(*accept_greedy(proposal, choices), proposal=proposal)
        choices = choices_after(context.choose, sequence, proposal, verified.logits)
        path, token = accept_greedy(proposal, choices)
        return Verdict(path, token, read=choices[1 + proposal.candidates :])

    def learn(self, context: Context, sequence: torch.Tensor, proposed: Proposed, verified: TargetPass,
              verdict: Verdict, kept: list[int], room: int) -> Learned:
        """Update the state kept across passes from the verdict; `sequence` [1, n] now ends with the
        committed tokens, of which the stop rules let `kept` into the answer. `room`: how many more
        tokens the answer may take after them, 0 where this pass ends it: a proposer queues work for
        its next proposal only where one may come."""
        return Learned()

    def summary(self, events: list[StepEvent]) -> dict:
        """The method's totals for the Summary, from its events."""
        return {}


@torch.inference_mode()
def decode(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    proposer: Proposer,
    *,
    method: str,
    max_new_tokens: int,
    sampling: SamplingConfig,
    eos_token_ids: Iterable[int] | None = None,
    stop: threading.Event | None = None,
    reach: int = 0,
    passes: CompiledPass | None = None,
) -> Iterator[StepEvent | Summary]:
    """Decode after `input_ids` [1, L] with `proposer`, one StepEvent a target pass, then a Summary.
    `reach`: how far past the answer's last position a pass feeds tokens (lookahead's window).
    `passes`: the target's compiled static pass (`static.compile_passes`); None: the eager pass."""
    check_request(input_ids, max_new_tokens, getattr(model.config, "max_position_embeddings", None), reach)
    # holds the committed tokens but the last few (at least the root); static, run by `passes`, when given
    cache = request_cache(model, input_ids.shape[1] + max_new_tokens + reach, passes)
    context = Context(model, TokenChooser(sampling, input_ids.device), resolve_eos(model, eos_token_ids),
                      model.device, padded_width(cache))
    recorder = StepRecorder(method, max_new_tokens, context.eos, stop)
    clock = PassClock(input_ids.device)
    sequence = input_ids  # [1, n] prompt + committed tokens
    events = []  # this run's events, for the proposer's totals
    while not recorder.done:
        # 1. Propose: the tokens the target checks this pass (none for AR).
        proposed = proposer.propose(context, sequence, recorder.room)
        proposal = proposed.proposal
        # 2. Verify: one target pass over the committed tokens it has not seen and every proposed node.
        clock.start()
        verified = target_pass(model, cache, sequence, proposal, features=proposer.features)
        clock.stop()
        # 3. Accept: the path the target agrees with, and its own token after it.
        verdict = proposer.accept(context, sequence, proposed, verified)
        target_s = clock.seconds()  # the verdict read the pass's choices: its end is past
        if verdict.proposal is not None:
            proposed = Proposed(verdict.proposal, proposed.step)
            proposal = verdict.proposal
        # 4. Commit: the answer grows by the path and the token.
        accepted = [proposal.tokens[node] for node in verdict.path]
        committed = [*accepted, verdict.token]
        kept = recorder.kept(committed)
        sequence = torch.cat([sequence, tensor_on([committed], sequence.device)], dim=-1)
        context.text.extend(committed)
        # 5. Learn: the proposer updates the state it keeps across passes and says what its event shows, before the
        # cache is trimmed and the step recorded: on a GPU what it queues for its next pass runs meanwhile.
        learned = proposer.learn(context, sequence, proposed, verified, verdict, kept, recorder.room_after(kept))
        commit(cache, verified, verdict.path)  # only the accepted path's KV entries stay in the target's cache
        events.append(recorder.step(
            committed=committed,
            proposed=proposal.tokens[: proposal.candidates],
            accepted=accepted,
            rejected=learned.rejected,
            draft_forwards=learned.draft_passes,
            data=learned.data,
            target_s=target_s,
        ))
        yield events[-1]
    yield recorder.summary(extra=proposer.summary(events))


class PassClock:
    """The seconds a target pass takes, read without a wait of its own. With CUDA a pass returns
    before it runs: two events on its stream time it (from when the device reaches the first,
    which is at once where it idles while the host lays the pass out), read once the step has
    waited for the pass's choices anyway; a synchronisation here would add a wait a step. Elsewhere
    a pass returns once done, and the host's clock times it."""

    def __init__(self, device: torch.device):
        self.device = device
        self.events = ((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                       if device.type == "cuda" else None)
        self.started = self.took = 0.0

    def start(self) -> None:
        if self.events:
            self.events[0].record(torch.cuda.current_stream(self.device))
        else:
            self.started = time.perf_counter()

    def stop(self) -> None:
        if self.events:
            self.events[1].record(torch.cuda.current_stream(self.device))
        else:
            self.took = time.perf_counter() - self.started

    def seconds(self) -> float:
        if self.events:
            self.events[1].synchronize()  # done already where the step read what the pass chose
            return self.events[0].elapsed_time(self.events[1]) / 1e3
        return self.took

