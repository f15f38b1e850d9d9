"""Logits processing and token choice, built from transformers' LogitsProcessor classes.

`SamplingConfig` holds the user's settings; `TokenChooser` turns a row of logits into the
next token, greedily or by seeded multinomial sampling. The processors run in the order of
transformers' `generate` (`GenerationMixin._get_logits_processor`: repetition penalty, the
no-repeat-n-gram ban, then temperature, top-k, top-p), so a method that uses them picks or
samples from the same distribution as `generate` would.
"""

from dataclasses import dataclass

import torch
from transformers import (
    LogitsProcessorList,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from specdemo.core.errors import SpecDemoError, check_whole


@dataclass(frozen=True)
class SamplingConfig:
    """Decoding settings. `do_sample=False` is greedy (temperature, top-k and top-p unused)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    top_p: float = 1.0  # 1.0: no nucleus cut
    repetition_penalty: float = 1.0  # 1.0: no penalty (CTRL, Keskar et al. 2019)
    seed: int | None = None  # None: a fresh random seed each generation
    no_repeat_ngram_size: int = 0  # n > 0: never repeat an n-gram of prompt + answer; 0: off

    def __post_init__(self):
        if not self.temperature > 0:
            raise SpecDemoError(f"temperature must be above 0, got {self.temperature} (use greedy decoding for 0)")
        check_whole("top_k", self.top_k, 0, what="0 turns it off")
        if not 0 < self.top_p <= 1:
            raise SpecDemoError(f"top_p must be in (0, 1], got {self.top_p}")
        if not self.repetition_penalty > 0:
            raise SpecDemoError(f"repetition_penalty must be above 0 (1.0 turns it off), got {self.repetition_penalty}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise SpecDemoError(f"seed must be a whole number or None, got {self.seed!r}")
        check_whole("no_repeat_ngram_size", self.no_repeat_ngram_size, 0, what="0 turns it off")


GREEDY = SamplingConfig()


def logits_processors(config: SamplingConfig) -> LogitsProcessorList:
    """The transformers processors for `config`, in `generate`'s order."""
    processors = LogitsProcessorList()
    if config.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(config.repetition_penalty))
    if config.no_repeat_ngram_size:
        processors.append(NoRepeatNGramLogitsProcessor(config.no_repeat_ngram_size))
    if config.do_sample:
        if config.temperature != 1.0:
            processors.append(TemperatureLogitsWarper(config.temperature))
        if config.top_k:
            processors.append(TopKLogitsWarper(config.top_k))
        if config.top_p < 1.0:
            processors.append(TopPLogitsWarper(config.top_p))
    return processors


class TokenChooser:
    """Chooses next tokens for one generation: holds its processors and its seeded RNG."""

    def __init__(self, config: SamplingConfig, device: torch.device | str):
        self.config = config
        self.processors = logits_processors(config)
        self.generator = torch.Generator(device=device)
        if config.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(config.seed)

    def scores(self, input_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Processed scores [1, V] for the token after `input_ids` [1, L], from raw `logits` [1, V]."""
        return self.processors(input_ids, logits.float())

    def __call__(self, input_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The next token [1, 1] after `input_ids` [1, L] given the raw `logits` [1, V]."""
        if not self.config.do_sample and not self.processors:
            return logits.argmax(dim=-1, keepdim=True)  # plain greedy: no float copy, no processor
        if not self.config.do_sample:
            return self.scores(input_ids, logits).argmax(dim=-1, keepdim=True)
        probs = torch.softmax(self.scores(input_ids, logits), dim=-1)  # [1, V]
        return torch.multinomial(probs, num_samples=1, generator=self.generator)

    def greedy_choices(self, sequence: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Greedy choices [k] at the last k prefixes of a path: `logits` [k, V] row i scores the
        token after sequence[:, : L - k + 1 + i] (`sequence` [1, L]). With a repetition penalty each
        row is processed with its own prefix, exactly as one-token decoding would."""
        if not self.processors:
            return logits.argmax(dim=-1)
        first = sequence.shape[1] - logits.shape[0] + 1
        rows = [self.scores(sequence[:, : first + i], logits[i : i + 1]) for i in range(logits.shape[0])]
        return torch.cat(rows).argmax(dim=-1)
