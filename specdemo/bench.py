"""`python -m specdemo.bench`: the one place SpecDemo measures speed.

Every method decodes every prompt greedily; methods run interleaved per prompt after a
warm-up, so drift of the machine hits them alike. Each generation is timed from the prompt's
token ids to the last token (prefill included, the device synchronized first on CUDA).
Speed is reported as a ratio against `ar` in the same run, and `matches_ar` checks that a
method's tokens equal AR's token for token.

    python -m specdemo.bench --methods ar,hf_generate --limit 3 --dtype float32 --json out.json
"""

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

# the bench's names (F401)
from specdemo.bench_table import (  # noqa: F401
    EAGER,
    OFFLOADED,
    REFERENCES,
    aggregate,
    by_category,
    compile_line,
    compile_report,
    defaults_report,
    format_table,
    guess_lines,
    guesses_per_pass,
    step_costs,
)
from specdemo.core.errors import SpecDemoError, in_one_line
from specdemo.core.events import final_summary, guesses_by_source
from specdemo.defaults import defaults_for, with_defaults
from specdemo.divergence import SUSPECT_MARGIN, divergences, rounding_noise
from specdemo.methods import METHODS, ar, decoded, get_method, method_options, settings_of, speculative, token_draft
from specdemo.models import LoadedModel, add_arguments, from_arguments, load_model

DEFAULT_PROMPTS = Path(__file__).with_name("prompts.jsonl")
WARMUP_TOKENS = 8


@dataclass(frozen=True)
class Run:
    """One method's answer to one prompt."""

    tokens: list[int]
    forward_passes: int  # target forward passes
    target_s: float = 0.0  # seconds in the target's passes (0: not measured, transformers' own loops)
    # our methods' step events (counted after the timing: `events.guesses_by_source`)
    events: list = field(default_factory=list)


Runner = Callable[..., Run]  # (target, input_ids, max_new_tokens, **settings) -> Run


def specdemo_runner(name: str, **fixed) -> Runner:
    """A runner for one of our step-event methods: its Summary gives tokens and passes. `fixed`:
    keyword arguments it always passes (an eager twin's passes=None); else it runs on the target's
    compiled pass, if it has one. Its settings are the device's defaults (`specdemo.defaults`) and
    those given, as on the page; an eager or offloaded twin takes its method's."""

    def run(target: LoadedModel, input_ids: torch.Tensor, max_new_tokens: int, **settings) -> Run:
        method, options = get_method(name).generate, method_options(name, target)
        events = method(
            target.model, input_ids, max_new_tokens=max_new_tokens, eos_token_ids=target.eos_token_ids, **options,
            **{"passes": target.passes, **fixed}, **with_defaults(defaults_for(target.device), name, settings)
        )
        return run_of(events)

    return run


def run_of(events) -> Run:
    """The Run of one of our methods' event streams, run to its end: its Summary gives tokens,
    passes and the target's time."""
    events = list(events)
    summary = final_summary(events)
    return Run(list(summary.tokens), summary.target_forwards, summary.target_s, events)


def hf_generate(target: LoadedModel, input_ids: torch.Tensor, max_new_tokens: int, **generate_options) -> Run:
    """transformers' own greedy `generate`: the peer our AR loop must keep up with.
    Target passes are counted by a hook on the target model, not assumed."""
    passes = []
    hook = target.model.register_forward_pre_hook(lambda module, args: passes.append(1))
    try:
        output = target.model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            eos_token_id=list(target.eos_token_ids),
            pad_token_id=pad_token_id(target),
            **generate_options,
        )
    finally:
        hook.remove()
    return Run(output[0, input_ids.shape[1] :].tolist(), len(passes))


def pad_token_id(target: LoadedModel) -> int | None:
    """The tokenizer's pad id (0 is a real id), else the first EOS id, else none: generate needs
    one only to pad finished rows, and our batch is a single row."""
    pad = target.tokenizer.pad_token_id
    return pad if pad is not None else next(iter(target.eos_token_ids), None)


def hf_assisted(target: LoadedModel, input_ids: torch.Tensor, max_new_tokens: int, **generate_options) -> Run:
    """transformers' assisted generation with our token draft (its own defaults for the number
    of draft tokens, unless set): the peer `speculative` must beat. transformers drafts over the
    whole vocabulary; only our loop uses the draft's smaller head. `speculative_token` runs our
    loop with this same draft, for a like-for-like comparison."""
    return hf_generate(target, input_ids, max_new_tokens, assistant_model=token_draft(target).model, **generate_options)


def speculative_token(target: LoadedModel, input_ids: torch.Tensor, max_new_tokens: int, **settings) -> Run:
    """Our speculative loop with the token draft (the one `hf_assisted` uses) where `speculative`
    takes the preset's feature draft: how much of the gain is the loop, how much the draft."""
    return run_of(speculative.generate(
        target.model, input_ids, max_new_tokens=max_new_tokens, eos_token_ids=target.eos_token_ids,
        draft=token_draft(target), passes=target.passes, **settings
    ))


def cllm_ar(target: LoadedModel, input_ids: torch.Tensor, max_new_tokens: int, **settings) -> Run:
    """AR on the CLLM's weights: the answer `cllm` must equal (the CLLM is a changed model, so
    the base model's AR is not its reference), and the speed of the CLLM without parallel decoding."""
    model, passes = decoded("cllm", target)
    return run_of(ar.generate(model, input_ids, max_new_tokens=max_new_tokens, eos_token_ids=target.eos_token_ids,
                              passes=passes, **settings))


def offloaded(target: LoadedModel) -> LoadedModel:
    """The target with every decoder layer offloaded to disk (`placement`), loaded once and held
    with the target: the same weights, streamed in at every pass."""
    return target.companions.get("offloaded to disk", lambda: load_model(
        target.spec, target.dtype, str(target.device), device_map="disk"))


def offloaded_runner(name: str) -> Runner:
    """A runner of method `name` on the target's offloaded twin (`offloaded`), eager."""
    run = specdemo_runner(name)
    return lambda target, input_ids, max_new_tokens, **settings: run(offloaded(target), input_ids, max_new_tokens,
                                                                      **settings)


# eager twins (`EAGER`): the method with compilation off (transformers' eager passes over DynamicCaches),
# beside the compiled methods in the same run: what compiling gains, and each method's speedup on
# either path (an eager twin is checked against, and its speedup reported against, `ar_eager`)
RUNNERS: dict[str, Runner] = {name: specdemo_runner(name) for name in METHODS} | {
    **{twin: specdemo_runner(name, passes=None) for twin, name in EAGER.items()},
    # offloaded twins (`OFFLOADED`): the method with the target's layers on disk, against AR offloaded the same way
    **{twin: offloaded_runner(name) for twin, name in OFFLOADED.items()},
    "hf_generate": hf_generate,
    "hf_assisted": hf_assisted,
    "speculative_token": speculative_token,
    "cllm_ar": cllm_ar,
}
# AR on other weights than the target's: its answer parts from the target's AR by design, so where
# it parts is not explained (a margin there says nothing about a bug)
OTHER_WEIGHTS = {"cllm_ar"}


def parse_methods(text: str) -> list[str]:
    """The requested methods, `ar` first (every ratio is against it), each once, and the
    reference of each that has its own (`cllm_ar` for `cllm`)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in RUNNERS]
    if unknown:
        raise SpecDemoError(f"unknown method(s) {', '.join(unknown)}: known methods are {', '.join(RUNNERS)}")
    return list(dict.fromkeys(["ar", *names, *(REFERENCES[name] for name in names if name in REFERENCES)]))


def read_prompts(path: Path, limit: int | None, per_category: int | None = None,
                 skip_per_category: int = 0) -> list[dict]:
    """Rows of a JSONL prompt file (MT-bench / Spec-Bench format); the first turn is the prompt.
    `per_category`: the first N rows of each category, in file order, after its first
    `skip_per_category` (a sample apart from one of fewer a category); then `limit`: the first N."""
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as error:
        raise SpecDemoError(f"cannot read prompts from {path}: {error}") from error
    if not rows or not all({"question_id", "turns"} <= set(row) and row["turns"] for row in rows):
        raise SpecDemoError(f"{path} must hold JSON lines with 'question_id' and a non-empty 'turns' list")
    if per_category is not None:
        if per_category < 1:
            raise SpecDemoError(f"--per-category must be at least 1, got {per_category}")
        if skip_per_category < 0:
            raise SpecDemoError(f"--skip-per-category must be at least 0, got {skip_per_category}")
        seen: dict[str, int] = {}
        sample = []
        for row in rows:
            category = row.get("category", "")
            seen[category] = seen.get(category, 0) + 1
            if skip_per_category < seen[category] <= skip_per_category + per_category:
                sample.append(row)
        rows = sample
    return rows[:limit] if limit else rows


# the function whose keyword arguments a runner's --set settings are (hf_* runners: transformers' generate,
# which checks its own)
SETTINGS_OF = {name: spec.generate for name, spec in METHODS.items()} | {
    "speculative_token": speculative.generate, "cllm_ar": ar.generate} | {
    twin: METHODS[name].generate for twin, name in (EAGER | OFFLOADED).items()}


def settable(method: str) -> list[str] | None:
    """The settings `--set METHOD.SETTING=VALUE` may give `method`; None when not ours to check."""
    if method not in SETTINGS_OF:
        return None
    return list(settings_of(SETTINGS_OF[method]))


def parse_settings(items: list[str], methods: list[str]) -> dict[str, dict]:
    """`--set lookahead.window=5` items as {method: {setting: value}} (values read as JSON when
    they parse, e.g. 5, 0.5, true; else as text). A setting the method does not take is refused
    here, before a model loads."""
    settings: dict[str, dict] = {name: {} for name in methods}
    for item in items:
        key, separator, text = item.partition("=")
        method, dot, name = (part.strip() for part in key.partition("."))
        if not separator or not dot or method not in settings:
            raise SpecDemoError(f"--set {item!r}: write METHOD.SETTING=VALUE for one of the methods run "
                                f"({', '.join(methods)})")
        known = settable(method)
        if known is not None and name not in known:
            raise SpecDemoError(f"--set {item!r}: {method} has no setting {name!r}; its settings: "
                                f"{', '.join(known) or 'none'}")
        text = text.strip()
        try:
            settings[method][name] = json.loads(text)
        except json.JSONDecodeError:
            settings[method][name] = text
    return settings


def timed(runner: Runner, target: LoadedModel, input_ids: torch.Tensor, max_new_tokens: int,
          settings: dict) -> tuple[Run, float]:
    if target.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    run = runner(target, input_ids, max_new_tokens, **settings)
    if target.device.type == "cuda":
        torch.cuda.synchronize()
    return run, time.perf_counter() - start


def explain_differences(target: LoadedModel, input_ids: torch.Tensor, methods: list[str],
                        answers: dict[str, list[int]]) -> dict:
    """For each method that should give its reference's answer but did not: where and by what
    margin it first differs (`divergence.divergences`, on the reference's weights)."""
    parted = {}
    for reference in dict.fromkeys(REFERENCES.get(name, "ar") for name in methods):
        others = {name: answers[name] for name in methods if REFERENCES.get(name, "ar") == reference
                  and name != reference and name not in OTHER_WEIGHTS
                  and not (name in METHODS and METHODS[name].other_answer)}
        others = {name: answer for name, answer in others.items() if answer != answers[reference]}
        if others:
            model, passes = (decoded("cllm", target) if reference == "cllm_ar"
                             else (offloaded(target).model, None) if reference in OFFLOADED
                             else (target.model, None if reference in EAGER else target.passes))
            parted |= divergences(model, input_ids, answers[reference], others, passes)
    return parted


def benchmark(target: LoadedModel, methods: list[str], prompts: list[dict], max_new_tokens: int,
              settings: dict | None = None, rounding: bool = False, deadline: float | None = None) -> dict:
    """Run every method on every prompt; return the report (the `--json` schema). With
    `rounding`, also measure on each prompt how far the dtype's rounding moves AR's top-two logit
    gaps (`divergence.rounding_noise`), the scale against which divergence margins are judged.
    `deadline` (a `time.monotonic()` value): no prompt but the first starts after it; the report
    holds the prompts done, every method on each (`prompts`)."""
    settings = settings or {name: {} for name in methods}
    noise: list[float] = []
    passes, failed, methods = target.passes, {}, list(methods)
    encoded = [(row["question_id"], row.get("category", ""), target.encode_chat(row["turns"][0])) for row in prompts]
    for name in list(methods):  # warm-up: first-call costs (allocations, lazy init) stay out of the timings
        try:
            RUNNERS[name](target, encoded[0][2], WARMUP_TOKENS, **settings[name])
        except Exception as error:  # noqa: BLE001 -- `dropped` says which and why
            methods = dropped(methods, name, error, failed)
    if passes:
        passes.runs.clear()  # the report counts the timed runs' passes only
    rows = []
    with tqdm(total=len(encoded) * len(methods), desc="bench", unit="run", file=sys.stderr) as progress:
        for index, (question_id, category, input_ids) in enumerate(encoded):
            if index and deadline is not None and time.monotonic() >= deadline:
                break
            # rotate the order per prompt, so no method always runs first (each still follows the same one)
            order = methods[index % len(methods) :] + methods[: index % len(methods)]
            runs = {}
            for name in (name for name in order if name in methods):
                try:
                    runs[name] = timed(RUNNERS[name], target, input_ids, max_new_tokens, settings[name])
                except Exception as error:  # noqa: BLE001 -- `dropped` says which and why
                    methods = dropped(methods, name, error, failed)
                progress.update()
            rows = [row for row in rows if row["method"] in methods]  # those of a method dropped since
            parted = explain_differences(target, input_ids, methods,
                                         {name: runs[name][0].tokens for name in methods})
            rows += [prompt_row(question_id, category, name, runs, parted) for name in methods]
            if rounding:
                noise.append(rounding_noise(target.model, input_ids, runs["ar"][0].tokens, target.passes))
    return {
        "model": target.spec,
        "device": str(target.device),
        "cpu_threads": torch.get_num_threads(),  # torch's, within the process's CPU quota (`core.process`)
        "dtype": str(target.dtype).removeprefix("torch."),
        "max_new_tokens": max_new_tokens,
        "compiled": compile_report(passes),
        "defaults": defaults_report(target.device, methods),
        "settings": settings,
        "prompts": {"asked": len(encoded), "done": len(rows) // len(methods)},
        "methods": aggregate(methods, rows),
        "rows": rows,
        **({"rounding_noise": {"max": max(noise), "per_prompt": noise}} if noise else {}),
        "suspect_margin": SUSPECT_MARGIN,
        **({"failed": failed} if failed else {}),
    }


def dropped(methods: list[str], name: str, error: Exception, failed: dict[str, str]) -> list[str]:
    """`methods` without `name`, whose run raised `error`, and without those measured against it
    (`REFERENCES`): kept in `failed` with why, the traceback on stderr, so that one method's fault
    costs the bench that method's rows, not the others'. A sentence for the person
    (`SpecDemoError`: a setting refused) and AR's failure end the bench."""
    if isinstance(error, SpecDemoError) or name == "ar":
        raise error
    print(f"{name} failed; the bench goes on without it:", file=sys.stderr, flush=True)
    traceback.print_exception(error, file=sys.stderr)
    failed[name] = in_one_line(error)
    failed |= {other: f"its reference {name} failed" for other in methods if REFERENCES.get(other) == name}
    return [other for other in methods if other not in failed]


def prompt_row(question_id, category: str, name: str, runs: dict, parted: dict) -> dict:
    """The report's row of method `name` on one prompt, from every method's run on it (`runs`:
    name -> (run, wall seconds)) and where each parted from its reference (`parted`)."""
    run, wall_s = runs[name]
    return {
        "question_id": question_id,
        "category": category,
        "method": name,
        "tokens": len(run.tokens),
        "forward_passes": run.forward_passes,
        "wall_s": wall_s,
        "target_s": run.target_s,
        "matches_ar": run.tokens == runs[REFERENCES.get(name, "ar")][0].tokens,
        "matches_base_ar": run.tokens == runs["ar"][0].tokens,
        "divergence": asdict(parted[name]) if parted.get(name) else None,
        "guesses_by_source": guesses_by_source(run.events),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m specdemo.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="ar,hf_generate", help=f"comma list from: {', '.join(RUNNERS)}")
    parser.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS,
                        help="JSONL file (question_id, category, turns)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    parser.add_argument("--per-category", type=int, default=None,
                        help="only the first N prompts of each category (a stratified sample)")
    parser.add_argument("--skip-per-category", type=int, default=0, metavar="N",
                        help="with --per-category: after the first N of each category (a sample apart from those)")
    parser.add_argument("--rounding-noise", action="store_true",
                        help="also measure how far the dtype's rounding moves AR's top-two logit gaps "
                             "(docs/divergence.md)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    add_arguments(parser)
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                        help="start no prompt (but the first) this many seconds after the bench began, loading "
                             "included, and report the prompts done: a run stopped from outside reports none")
    parser.add_argument("--set", action="append", default=[], metavar="METHOD.SETTING=VALUE",
                        help="a method's own setting, e.g. lookahead.window=5 or speculative.gamma=4 (repeatable)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, target: LoadedModel | None = None) -> dict:
    """Run the bench as `argv` asks; `target`: the model already loaded as they ask (a caller that
    holds one), else loaded here."""
    started, args = time.monotonic(), parse_args(argv)
    methods = parse_methods(args.methods)
    if args.limit is not None and args.limit < 1:
        raise SpecDemoError(f"--limit must be at least 1, got {args.limit}")
    settings = parse_settings(args.set, methods)
    prompts = read_prompts(args.prompts, args.limit, args.per_category, args.skip_per_category)
    target = from_arguments(args, lambda message: print(message, file=sys.stderr, flush=True), target)
    report = benchmark(target, methods, prompts, args.max_new_tokens, settings, args.rounding_noise,
                       None if args.deadline is None else started + args.deadline)
    print(format_table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    try:
        main()
    except SpecDemoError as error:
        sys.exit(f"error: {error}")
