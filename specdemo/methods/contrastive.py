"""Contrastive decoding: the expert's next token is the one it prefers most over an amateur.

Li et al. 2023, "Contrastive Decoding: Open-ended Text Generation as Optimization" (ACL 2023).
The target `model` is the expert, a smaller LM of the same vocabulary the amateur. Each step,
one pass of each (both with their own KV cache, one new token each after the prefill) gives
log p_EXP and log p_AMA over the vocabulary. The expert's pass is the engine's target pass with
nothing proposed (`verify.target_pass`, on `static.request_cache`: the compiled static pass where
the expert has one), as AR's is; the amateur, another model, runs its own eager pass on
transformers' cache. Then (§3.2, §3.3)

    V_head   = {x : p_EXP(x) >= α · max_w p_EXP(w)}             the adaptive plausibility constraint
    score(x) = log p_EXP(x) - log p_AMA(x)   if x in V_head,   -inf otherwise
    next     = argmax_x score(x)                                 (greedy search on the CD objective)

p_AMA is the amateur's distribution at temperature τ (§3.4): softmax(amateur logits / τ). The
paper sets τ to 0.5 or 1.0 in its main experiments; its code runs GPT-2 XL against GPT-2 small
at τ = 0.5 (OPT pairs at 1.0), and α = 0.1 throughout. We take α = 0.1, τ = 0.5.

A token the amateur likes even more than the expert (repetition, a generic word) is pushed
down; the constraint keeps a token the expert finds unlikely from winning on a tiny p_AMA.
With α = 1 or a uniform amateur, the choice is the expert's own greedy token.

Each step's `data`, a `steps.ContrastiveStep`, for the app to teach with:
    candidates      the `top_candidates` tokens most likely under the expert (most likely
                    first), then the chosen token if it is not among them; each a dict
                    token           the token id
                    expert_logprob  log p_EXP(token)
                    amateur_logprob log p_AMA(token), at temperature τ
                    score           expert_logprob - amateur_logprob, None outside V_head
                    plausible       whether the token is in V_head
    cutoff_logprob  log α + max log p_EXP: the least expert log-prob a token of V_head has
    chosen          the committed token: the best score
    expert_choice   the expert's argmax (what greedy AR would commit here)
    amateur_choice  the amateur's argmax
"""

import math
import threading
from collections.abc import Iterable, Iterator

import torch
from transformers import DynamicCache, PreTrainedModel

from specdemo.core.errors import SpecDemoError, check_request, check_whole
from specdemo.core.events import StepEvent, Summary
from specdemo.core.recorder import StepRecorder, resolve_eos
from specdemo.core.static import CompiledPass, request_cache
from specdemo.core.steps import ContrastiveStep
from specdemo.core.verify import EMPTY, target_pass

ALPHA = 0.1  # the plausibility threshold of the paper's experiments
AMATEUR_TEMPERATURE = 0.5  # τ of the paper's GPT-2 runs (§3.4; the authors' run_generation.py example)


def expert_and_amateur_logprobs(
    expert_logits: torch.Tensor, amateur_logits: torch.Tensor, amateur_temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p_EXP and log p_AMA at temperature τ (§3.4), each [V] in float32."""
    expert = expert_logits.float().log_softmax(-1)  # [V]
    amateur = (amateur_logits.float() / amateur_temperature).log_softmax(-1)  # [V]
    return expert, amateur


def contrastive_scores(expert: torch.Tensor, amateur: torch.Tensor, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The CD-score of every token (§3.3) and the plausible set V_head (§3.2), both [V], from
    log p_EXP and log p_AMA [V]: the score is log p_EXP - log p_AMA on V_head and -inf off it."""
    plausible = expert >= math.log(alpha) + expert.max()  # [V]: p_EXP(x) >= α · max p_EXP
    scores = (expert - amateur).masked_fill(~plausible, float("-inf"))  # [V]
    return scores, plausible


@torch.inference_mode()
def generate(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    amateur: PreTrainedModel,
    max_new_tokens: int = 128,
    alpha: float = ALPHA,
    amateur_temperature: float = AMATEUR_TEMPERATURE,
    top_candidates: int = 8,
    eos_token_ids: Iterable[int] | None = None,
    stop: threading.Event | None = None,
    passes: CompiledPass | None = None,
) -> Iterator[StepEvent | Summary]:
    """Decode after the prompt `input_ids` [1, L], one expert pass and one amateur pass a token.
    `passes`: the expert's compiled static pass (None: eager); the amateur's passes run eagerly."""
    check_settings(model, amateur, input_ids, max_new_tokens, alpha, amateur_temperature, top_candidates)
    eos = resolve_eos(model, eos_token_ids)
    recorder = StepRecorder("contrastive", max_new_tokens, eos, stop)
    # static when the expert is compiled
    expert_cache = request_cache(model, input_ids.shape[1] + max_new_tokens, passes)
    amateur_cache = DynamicCache(config=amateur.config)
    sequence = input_ids  # [1, n] prompt + committed tokens
    pending = input_ids  # tokens the amateur's cache has not seen yet: the whole prompt, then one token
    while not recorder.done:
        # 1. One pass of each model over the same new tokens: the expert's is the engine's target pass.
        expert_logits = target_pass(model, expert_cache, sequence, EMPTY).logits[0]  # [V]
        # [V]
        amateur_logits = amateur(pending, past_key_values=amateur_cache, use_cache=True, logits_to_keep=1).logits[0, -1]
        # 2. Score the plausible tokens by how much more the expert likes them; take the best.
        # [V] each
        log_p_expert, log_p_amateur = expert_and_amateur_logprobs(expert_logits, amateur_logits, amateur_temperature)
        scores, plausible = contrastive_scores(log_p_expert, log_p_amateur, alpha)
        chosen = int(scores.argmax())
        pending = torch.tensor([[chosen]], device=input_ids.device)  # [1, 1]
        sequence = torch.cat([sequence, pending], dim=-1)
        data = step_data(log_p_expert, log_p_amateur, scores, plausible, chosen, alpha, top_candidates)
        yield recorder.step(committed=(chosen,), draft_forwards=1, data=data)
    yield recorder.summary()


def check_settings(model, amateur, input_ids, max_new_tokens, alpha, amateur_temperature, top_candidates) -> None:
    """Refuse a request contrastive decoding cannot serve, before any model pass."""
    for lm in (model, amateur):
        check_request(input_ids, max_new_tokens, getattr(lm.config, "max_position_embeddings", None))
    if amateur.config.vocab_size != model.config.vocab_size:
        raise SpecDemoError(
            f"the amateur's vocabulary ({amateur.config.vocab_size} tokens) differs from the expert's "
            f"({model.config.vocab_size}): contrastive decoding compares the two models token by token, "
            "so choose an amateur of the expert's family (same tokenizer)"
        )
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha <= 1:
        raise SpecDemoError(f"alpha (the plausibility threshold) must be a number in (0, 1], got {alpha!r}")
    if (isinstance(amateur_temperature, bool) or not isinstance(amateur_temperature, (int, float))
            or not amateur_temperature > 0):
        raise SpecDemoError(f"amateur_temperature must be a positive number, got {amateur_temperature!r}")
    check_whole("top_candidates", top_candidates, 1, 64)


def step_data(expert, amateur, scores, plausible, chosen, alpha, top_candidates) -> ContrastiveStep:
    """The numbers behind one choice (see the module docstring), from log p_EXP, log p_AMA,
    the scores and V_head, all [V]."""
    shown = expert.topk(min(top_candidates, expert.shape[-1])).indices.tolist()
    if chosen not in shown:
        shown.append(chosen)
    index = torch.tensor(shown, device=expert.device)
    rows = zip(shown, expert[index].tolist(), amateur[index].tolist(), scores[index].tolist(),
               plausible[index].tolist())
    candidates = [
        {"token": token, "expert_logprob": e, "amateur_logprob": a, "score": s if ok else None, "plausible": ok}
        for token, e, a, s, ok in rows
    ]
    return ContrastiveStep(
        candidates=candidates,
        cutoff_logprob=math.log(alpha) + expert.max().item(),
        chosen=chosen,
        expert_choice=int(expert.argmax()),
        amateur_choice=int(amateur.argmax()),
    )
