"""Real prompts for self-distillation: a JSONL reader and a seeded sampling plan.

The prompts live outside the project (`../shared/train/` on our machines: the T0 training mix,
GSM8K's training split and Self-Instruct's instructions, one `{"prompt", "source"}` object a line;
the public sources and their terms are in docs/training.md). Nothing here copies them: a trainer
reads them with `--prompts PATH...` and `plan` picks a reproducible sample: at most `cap_per_source`
prompts of each source (T0's templates are uneven in size), none longer than `max_chars`, none that
near-copies a benchmark prompt or a prompt the page shows (`HeldOut`), shuffled by `seed`.
"""

import json
import random
import re
from dataclasses import dataclass, replace
from pathlib import Path

from specdemo.app.lesson import shown_prompts
from specdemo.bench import DEFAULT_PROMPTS

SHARED_TRAIN = Path(__file__).resolve().parents[1].parent / "shared" / "train"
SHARED_BENCH = Path(__file__).resolve().parents[1].parent / "shared" / "bench" / "spec_bench_question.jsonl"
NEAR_COPY_WORDS = 10  # the rule shared/train was deduplicated against Spec-Bench with


@dataclass(frozen=True)
class Prompt:
    text: str
    source: str


@dataclass(frozen=True)
class SamplingPlan:
    """Which prompts to take: at most `cap_per_source` per source (`caps` overrides it for the
    sources under a prefix, e.g. (("gsm8k", 2000),)), at most `max_chars` long, at most `limit` in
    all (None: no limit), shuffled by `seed`."""

    cap_per_source: int = 30
    caps: tuple[tuple[str, int], ...] = ()
    max_chars: int = 2000
    limit: int | None = None
    seed: int = 0

    def cap(self, source: str) -> int:
        matches = [(len(prefix), cap) for prefix, cap in self.caps if source.startswith(prefix)]
        return max(matches)[1] if matches else self.cap_per_source


def read_prompts(paths: list[Path]) -> list[Prompt]:
    """Every prompt of the JSONL files, in file order; `source` defaults to the file's name."""
    prompts = []
    for path in paths:
        for number, line in enumerate(Path(path).read_text().split("\n"), 1):
            if not line.strip():
                continue
            record = json.loads(line)
            if not isinstance(record.get("prompt"), str):
                raise ValueError(f"{path}:{number}: no 'prompt' string")
            prompts.append(Prompt(record["prompt"], str(record.get("source", Path(path).stem))))
    return prompts


def words_of(text: str) -> list[str]:
    """The words of `text`, lower case, without punctuation ("blue?" and "blue," are one word)."""
    return re.findall(r"[\w']+", text.lower())


def word_runs(text: str, length: int = NEAR_COPY_WORDS) -> set[tuple[str, ...]]:
    words = words_of(text)
    return {tuple(words[i : i + length]) for i in range(len(words) - length + 1)}


class HeldOut:
    """Texts no training prompt may copy: a prompt near-copies one when it shares a run of
    NEAR_COPY_WORDS words with it, or holds all of its words in a row where it is shorter."""

    def __init__(self, texts: list[str]):
        self.texts = {text.strip() for text in texts}
        self.runs: dict[int, set[tuple[str, ...]]] = {}
        for text in texts:
            length = min(NEAR_COPY_WORDS, len(words_of(text)))
            if length:
                self.runs.setdefault(length, set()).update(word_runs(text, length))

    def copied_by(self, prompt: str) -> bool:
        return prompt.strip() in self.texts or any(word_runs(prompt, length) & runs for length, runs in self.runs.items())


def bench_prompts(spec_bench: Path | None = SHARED_BENCH) -> list[str]:
    """The prompts no training plan may hold: our own bench prompts, the prompts the page and the
    docs show (`lesson.shown_prompts`: a gain shown on them must be prediction, not recall) and,
    where the file exists, Spec-Bench's questions (every turn)."""
    texts = [json.loads(line)["turns"][0] for line in DEFAULT_PROMPTS.read_text().splitlines() if line.strip()]
    texts += shown_prompts()
    if spec_bench is not None and spec_bench.exists():
        texts += [turn for line in spec_bench.read_text().split("\n") if line.strip() for turn in json.loads(line)["turns"]]
    return texts


def plan(prompts: list[Prompt], sampling: SamplingPlan, bench: list[str]) -> list[Prompt]:
    """The sample `sampling` describes, with every prompt that is or nearly copies a held-out
    prompt of `bench` (`HeldOut`) left out."""
    held = HeldOut(bench)
    by_source: dict[str, list[Prompt]] = {}
    for prompt in prompts:
        if len(prompt.text) > sampling.max_chars or not prompt.text.strip() or held.copied_by(prompt.text):
            continue
        by_source.setdefault(prompt.source, []).append(prompt)
    rng = random.Random(sampling.seed)
    chosen = []
    for source in sorted(by_source):
        group = sorted(set(by_source[source]), key=lambda p: p.text)
        rng.shuffle(group)
        chosen += group[: sampling.cap(source)]
    rng.shuffle(chosen)
    return chosen[: sampling.limit] if sampling.limit is not None else chosen


def unseen(prompts: list[Prompt], sampling: SamplingPlan, bench: list[str], count: int) -> list[Prompt]:
    """`count` prompts drawn as `sampling` draws (the same sources and caps) with the next seed,
    none of them in `sampling`'s own plan: held-out prompts of the same mix for a plan that
    self-distillation answered whole."""
    taken = {prompt.text for prompt in plan(prompts, sampling, bench)}
    others = plan(prompts, replace(sampling, seed=sampling.seed + 1, limit=None), bench)
    return [prompt for prompt in others if prompt.text not in taken][:count]


def mixed_in(prompts: list[Prompt], texts: list[str], source: str, seed: int) -> list[Prompt]:
    """`prompts` with `texts` (of `source`) added, shuffled by `seed` so every shard holds both."""
    mixed = prompts + [Prompt(text, source) for text in texts]
    random.Random(seed).shuffle(mixed)
    return mixed
