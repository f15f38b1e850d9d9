"""Beam search: k hypotheses decoded side by side, all k in one batched target pass per step.

The rules are those of transformers' `GenerationMixin._beam_search` (5.x), restated:
  1. A step scores every (beam, token) pair by the beam's cumulative log-probability plus the
     token's log-probability (log_softmax of the logits, then the repetition penalty and the
     n-gram ban, each beam on its own prefix). At the first step only the prompt is a beam.
     The best (1 + number of EOS ids) * k pairs (at least 2k) are this step's candidates.
  2. A candidate among the best k that ends (its token is an EOS id, or it is max_new_tokens
     long) is a finished hypothesis with the score log_prob / length ** length_penalty
     (the length penalty of Wu et al. 2016 as transformers applies it: length counts the new
     tokens, EOS included); the k best finished hypotheses are kept.
  3. The k best candidates (by log_prob) that did not end are the next step's beams; the
     KV cache rows are reordered to them (the prompt is fed once, [1, L], and its cache copied
     to the k rows; every later pass feeds the k beams' last tokens together, [k, 1]). The
     passes are the engine's (`verify.batch_pass`): one beam's is the target pass AR takes, the
     compiled static one where the model has it; k beams run transformers' batched pass eagerly
     on its cache (`verify.batch_cache`: a static cache holds one row).
  4. The search ends at max_new_tokens; or once k hypotheses are finished, either at once
     (early_stopping=True) or when the best beam cannot beat the worst kept finished one:
     its log_prob / L ** length_penalty is not above it, L being its current length
     (early_stopping="never" with length_penalty > 0: max_new_tokens, the best it could reach).
  5. The answer is the best finished hypothesis.
One beam is greedy decoding, as transformers runs num_beams=1 as greedy search: it stops at its
first finished hypothesis whatever early_stopping says, and its processors act on the logits.
Greedy only: do_sample=True is refused (a SamplingConfig brings just its processors).

Streaming: the answer starts with the longest common prefix of the live beams and the kept
finished hypotheses (every future finished one extends a live beam), so each step commits
that prefix's growth, and the last step the rest of the chosen hypothesis.

StepEvent.data of each step (one target pass), a `steps.BeamStep`:
    num_beams   k
    beams       this step's candidates, best log_prob first; each a dict:
                  token     the token this step appended
                  tokens    all the candidate's new tokens (after the prompt), ending in `token`
                  log_prob  cumulative log-probability of `tokens`
                  score     log_prob / len(tokens) ** length_penalty (what finished ones rank by)
                  parent    index of the beam it extends: the `beam` of a kept candidate of the
                            previous step (0 at the first step: the prompt)
                  beam      its index among the next step's beams when kept, else None
                  status    "kept" (a beam for the next step), "finished" (ended, and among the
                            k best finished hypotheses now) or "pruned"
    finished    the kept finished hypotheses, best score first: dicts of tokens, log_prob, score
    chosen      (last step only, when the search ended) the new tokens of the answer
"""

import math
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from transformers import LogitsProcessorList, PreTrainedModel

from specdemo.core.errors import SpecDemoError, check_request, check_whole
from specdemo.core.events import StepEvent, Summary
from specdemo.core.recorder import StepRecorder, resolve_eos
from specdemo.core.sampling import GREEDY, SamplingConfig, logits_processors
from specdemo.core.static import CompiledPass
from specdemo.core.steps import BeamStep
from specdemo.core.verify import batch_cache, batch_pass

NO_BEAM = -1e9  # log_prob of the beams that do not exist yet at the first step (transformers' value)


@dataclass(frozen=True)
class Hypothesis:
    """A finished hypothesis: its new tokens (ending in EOS, or max_new_tokens long)."""

    tokens: tuple[int, ...]
    log_prob: float
    score: float  # log_prob / len(tokens) ** length_penalty


@torch.inference_mode()
def generate(
    model: PreTrainedModel, input_ids: torch.Tensor, *,
    max_new_tokens: int = 128,
    num_beams: int = 4,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    sampling: SamplingConfig = GREEDY,
    eos_token_ids: Iterable[int] | None = None,
    stop: threading.Event | None = None,
    passes: CompiledPass | None = None,
) -> Iterator[StepEvent | Summary]:
    """Beam search after the prompt `input_ids` [1, L] with `num_beams` beams (k). `passes`: the
    target's compiled static pass, which one beam takes (None: eager); k beams' batched passes run eagerly."""
    prompt_length = check_request(input_ids, max_new_tokens, getattr(model.config, "max_position_embeddings", None))
    check_beam_settings(num_beams, length_penalty, early_stopping, sampling)
    eos = resolve_eos(model, eos_token_ids)
    recorder = StepRecorder("beam", max_new_tokens, eos, stop)
    processors = logits_processors(sampling)
    k = num_beams
    width = max(2, 1 + len(recorder.eos_token_ids)) * k  # candidates per step: enough for k that do not end
    # static for one beam when the model is compiled
    cache = batch_cache(model, prompt_length + max_new_tokens, k, passes)
    sequences = input_ids.expand(k, -1)  # [k, L + t]: prompt and new tokens of each beam
    beam_log_probs = torch.full((k,), NO_BEAM, device=input_ids.device)  # [k]
    beam_log_probs[0] = 0.0
    finished: list[Hypothesis] = []
    while not recorder.done:
        # 1. one target pass for all beams: the prompt once [1, L], then each beam's last token together [k, 1]
        logits = batch_pass(model, cache, sequences[:1] if recorder.target_forwards == 0 else sequences)  # [1 or k, V]
        if recorder.target_forwards == 0 and k > 1:
            cache.batch_repeat_interleave(k)  # every beam starts from the prompt's keys and values
        log_probs = next_log_probs(processors, sequences, logits.expand(k, -1))  # [k, V]
        # 2. the best (beam, token) pairs
        candidate_log_probs, parents, tokens = top_candidates(log_probs, beam_log_probs, width)  # [w] each
        length = sequences.shape[1] - prompt_length + 1  # new tokens of every candidate
        scores = candidate_log_probs / length**length_penalty  # [w]
        candidates = torch.cat([sequences[parents], tokens[:, None]], dim=-1)  # [w, L + length]
        new_tokens = [tuple(c) for c in candidates[:, prompt_length:].tolist()]
        ends = [c[-1] in recorder.eos_token_ids or length == max_new_tokens for c in new_tokens]
        # 3. ended candidates among the best k join the finished ones; the best k that go on are the beams
        ended = [Hypothesis(new_tokens[i], candidate_log_probs[i].item(), scores[i].item())
                 for i in range(k) if ends[i]]
        finished = sorted(finished + ended, key=lambda h: h.score, reverse=True)[:k]
        kept = [i for i in range(width) if not ends[i]][:k]
        if kept:  # none only at max_new_tokens, where the search ends
            sequences, beam_log_probs = candidates[kept], candidate_log_probs[kept]
        # 4. stop or go on; commit what every possible answer starts with
        over = search_over(length, beam_log_probs, finished, k, max_new_tokens, length_penalty, early_stopping)
        certain = (finished[0].tokens if over
                   else common_prefix([new_tokens[i] for i in kept] + [h.tokens for h in finished]))
        chosen = list(finished[0].tokens) if over else None
        data = step_data(new_tokens, candidate_log_probs, scores, parents, kept, ends, finished, k, chosen)
        yield recorder.step(committed=certain[len(recorder.tokens) :], data=data)
        if over:
            break
        if k > 1:
            cache.reorder_cache(parents[kept])
    answer = ({"log_prob": finished[0].log_prob, "score": finished[0].score}
              if recorder.finish_reason != "stopped" else {})
    yield recorder.summary(extra={"num_beams": k} | answer)


def check_beam_settings(num_beams: int, length_penalty: float, early_stopping: bool | str,
                        sampling: SamplingConfig) -> None:
    check_whole("num_beams", num_beams, 1, what="1 is greedy decoding")
    if (isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float))
            or not math.isfinite(length_penalty)):
        raise SpecDemoError("length_penalty must be a number (1.0: score = mean log-probability), got "
                            f"{length_penalty!r}")
    if not (isinstance(early_stopping, bool) or early_stopping == "never"):
        raise SpecDemoError(f'early_stopping must be True, False or "never", got {early_stopping!r}')
    if sampling.do_sample:
        raise SpecDemoError("beam search here is greedy: turn sampling off (the repetition penalty and n-gram ban "
                            "still apply)")


def next_log_probs(processors: LogitsProcessorList, sequences: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Log-probabilities [k, V] of each beam's next token from `logits` [k, V], the processors
    reading each beam's own `sequences` [k, L + t] row. Beam search processes the log_softmax, as
    transformers' `_beam_search` does; one beam processes the logits first, as its greedy search
    does, so that num_beams=1 is greedy decoding even with a repetition penalty."""
    if logits.shape[0] == 1:
        return torch.log_softmax(processors(sequences, logits), dim=-1)
    return processors(sequences, torch.log_softmax(logits, dim=-1))


def top_candidates(log_probs: torch.Tensor, beam_log_probs: torch.Tensor, width: int) -> tuple[torch.Tensor, ...]:
    """The `width` best (beam, token) pairs by cumulative log-probability: their log-probs [w],
    beam indices [w] and tokens [w], best first. `log_probs` [k, V], `beam_log_probs` [k]."""
    vocab_size = log_probs.shape[1]
    totals = (log_probs + beam_log_probs[:, None]).view(-1)  # [k * V]
    best, index = torch.topk(totals, width)
    return best, index // vocab_size, index % vocab_size


def search_over(
    length: int,
    beam_log_probs: torch.Tensor,
    finished: list[Hypothesis],
    k: int,
    max_new_tokens: int,
    length_penalty: float,
    early_stopping: bool | str,
) -> bool:
    """Rule 4: no beam can go on, or enough is finished and (per `early_stopping`) no beam can win."""
    if length == max_new_tokens:
        return True
    if len(finished) < k:
        return False
    if early_stopping is True or k == 1:  # one beam is greedy search, as transformers runs num_beams=1
        return True
    best_length = max_new_tokens if early_stopping == "never" and length_penalty > 0 else length
    best_possible = (beam_log_probs[0] / best_length**length_penalty).item()
    return best_possible <= finished[-1].score


def common_prefix(sequences: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The longest prefix all `sequences` share."""
    prefix = []
    for column in zip(*sequences):
        if any(token != column[0] for token in column):
            break
        prefix.append(column[0])
    return tuple(prefix)


def step_data(
    new_tokens: list[tuple[int, ...]],
    candidate_log_probs: torch.Tensor,
    scores: torch.Tensor,
    parents: torch.Tensor,
    kept: list[int],
    ends: list[bool],
    finished: list[Hypothesis],
    k: int,
    chosen: list[int] | None,
) -> BeamStep:
    """The step's candidates (all [w]), beams and finished hypotheses for a view (see the module docstring)."""
    finished_tokens = {h.tokens for h in finished}
    beams = []
    rows = zip(new_tokens, candidate_log_probs.tolist(), scores.tolist(), parents.tolist())
    for i, (tokens, log_prob, score, parent) in enumerate(rows):
        status = "kept" if i in kept else "finished" if i < k and ends[i] and tokens in finished_tokens else "pruned"
        beam = kept.index(i) if i in kept else None
        beams.append(dict(token=tokens[-1], tokens=list(tokens), log_prob=log_prob, score=score, parent=parent,
                          beam=beam, status=status))
    hypotheses = [{"tokens": list(h.tokens), "log_prob": h.log_prob, "score": h.score} for h in finished]
    return BeamStep(num_beams=k, beams=beams, finished=hypotheses, chosen=chosen)
