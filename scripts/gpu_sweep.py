"""The sweep that chooses a device's defaults (`specdemo.defaults`): each candidate set of a
method's settings, benched against AR in the same run, one process and one load for all of them.

    PYTHONPATH=. python scripts/gpu_sweep.py --prompts spec_bench_question.jsonl --per-category 1 --json OUT.json

The candidates run in turns, a candidate of each method a turn, each turn as `python -m specdemo.bench
--methods ar,METHOD,... --set ...` would, on the same loaded (and, with CUDA, graphed) target: every
candidate of a turn against the turn's one AR run, each prompt's runs in a rotating order. A candidate
names every setting it changes, the rest being the device's current set (`specdemo.defaults`). It prints
a line a candidate after each turn, rewriting --json, then the lines again, best first within each
method. With --deadline no turn starts past it, and a turn begun before it starts no prompt past it
(a row says how many prompts it ran); --resume keeps the rows --json holds and measures the rest.
`--chosen REPORT` prints, without loading a model, each method's best candidate in that report as the
bench's `--set` items, a line each (`chosen`): what the prepared check benches next, on other questions.
On a CPU it measures tokens a pass, which do not depend on the device; the speedups there are a CPU's.
"""

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

from specdemo.bench import DEFAULT_PROMPTS, benchmark, read_prompts
from specdemo.core.static import default_compile
from specdemo.defaults import defaults_for
from specdemo.methods.static_draft_tree import full_paths
from specdemo.models import compiled, load_model

# per method, what a GPU is likeliest to choose first: the GPU's set and its rivals, then the CPU's defaults, then
# deeper and wider; a candidate sets what it changes from the device's set (`specdemo.defaults`). A turn takes the next
# candidate of each method (`turns`), so a sweep cut short by its time limit has the first ones of every method.
# NO_GUESSES: the tree without the branch the host copies or retrieves, whose Python a GPU waits for
NO_GUESSES = dict(copy_length=0, retrieve=False)
MORE_GUESSES = dict(retrieved_branches=3)
CANDIDATES = {
    "speculative": [dict(gamma=2, draft_tree_size=31, draft_tree_top_k=6),
                    # EAGLE-3's tree: a feature draft grows it on the device, read once (`device_draft_tree`)
                    dict(gamma=7, draft_tree_size=60, draft_tree_top_k=10),
                    # the draft's own paths (`training.eagle_tree`), 60 and a copy of up to 3: the 64-token pass
                    dict(gamma=6, draft_tree_size=60, static_tree=True),
                    dict(gamma=2, static_tree=full_paths(7, 2)),  # 56 nodes and a copy: the 64-token pass
                    dict(gamma=6, draft_tree_size=60, static_tree=True, **NO_GUESSES),
                    dict(gamma=2, draft_tree_size=7, draft_tree_top_k=3),
                    dict(gamma=2, draft_tree_size=31, draft_tree_top_k=6, **NO_GUESSES),
                    *(dict(gamma=gamma, draft_tree_size=31, draft_tree_top_k=6) for gamma in (3, 4))],
    "medusa": [dict(tree_size=31), dict(tree_size=63), dict(tree="static", tree_size=57),  # static: and a copy
               dict(tree_size=31, **NO_GUESSES), dict(tree_size=8), dict(tree_size=20)],
    # MORE_GUESSES: three guesses from earlier answers in place of one (REST's trie, a branch a next token)
    "lookahead": [dict(window=4, candidates=7), dict(window=4, candidates=7, **MORE_GUESSES),
                  dict(window=7, ngram=4, candidates=10), dict(window=5, ngram=4, candidates=7),
                  dict(window=2, candidates=3)],
    "cllm": [dict(window=3, candidates=7), dict(window=3, candidates=7, **MORE_GUESSES),
             dict(window=4, ngram=4, candidates=7), dict(window=1, candidates=3)],
}


def turns(methods: list[str], done: list[dict] = ()) -> list[list[tuple[str, dict]]]:
    """The methods' candidates in turns: every method's first, then every second... Those with a
    row in `done` (an earlier sweep's, `--resume`) are left out."""
    measured = {(row["method"], same(row["settings"])) for row in done}
    lists = [[(method, settings) for settings in CANDIDATES[method] if (method, same(settings)) not in measured]
             for method in methods]
    return [[pair for pair in turn if pair is not None] for turn in itertools.zip_longest(*lists)]


def same(settings: dict) -> str:
    """`settings` as their JSON: a candidate and its row read back from a report compare equal."""
    return json.dumps(settings, sort_keys=True)


def sweep(target, prompts: list[dict], max_new_tokens: int, methods: list[str], out: Path | None = None,
          deadline: float | None = None, done: list[dict] = ()) -> list[dict]:
    """One row a candidate: its settings, tokens a pass, its speedup against its turn's AR, what a
    step costs, whether every answer was its reference's and on how many prompts; `out` (JSON)
    rewritten after each turn, so a sweep stopped by its time limit keeps what it measured.
    `deadline` (a `time.monotonic()` value): no turn starts after it, nor a turn's prompt but its first.
    `done`: rows measured already (an earlier sweep's), kept first and not measured again."""
    rows = list(done)
    for index, turn in enumerate(turns(methods, done)):
        if index and deadline is not None and time.monotonic() >= deadline:
            break
        running = [method for method, _ in turn]
        names = ["ar", *running, *(["cllm_ar"] if "cllm" in running else [])]
        report = benchmark(target, names, prompts, max_new_tokens, {"ar": {}, "cllm_ar": {}, **dict(turn)},
                           deadline=deadline)
        for method, settings in turn:
            if method in report.get("failed", {}):  # the candidate's fault, on stderr: the sweep goes on
                print(f"{method:<12} {settings}: failed, {report['failed'][method]}", flush=True)
                continue
            stats = report["methods"][method]
            rows.append({"method": method, "settings": settings, "tokens_per_forward": stats["tokens_per_forward"],
                         "speedup": stats.get("speedup_vs_own_ar", stats["speedup_vs_ar"]),
                         "step_ms": stats["step_ms"], "target_pass_ms": stats["target_pass_ms"],
                         "ar_step_ms": report["methods"]["ar"]["step_ms"], "matches_ar": stats["matches_ar"],
                         "prompts": report["prompts"]["done"]})
            print(line(rows[-1]), flush=True)
        if out:
            out.write_text(json.dumps({"device": str(target.device), "dtype": str(target.dtype), "rows": rows},
                                      indent=1))
    return rows


def earlier(path: Path | None, target) -> list[dict]:
    """The rows of the sweep report at `path` where it was made on `target`'s device and dtype; else none."""
    if path is None or not path.exists():
        return []
    report = json.loads(path.read_text())
    if (report["device"], report["dtype"]) != (str(target.device), str(target.dtype)):
        return []
    return report["rows"]


def chosen(rows: list[dict]) -> dict[str, dict]:
    """Each method's candidate of highest speedup among its rows measured on the most prompts (a
    row that a deadline cut short is the noisier): the settings the device's set would take."""
    best = {}
    for method in dict.fromkeys(row["method"] for row in rows):
        rows_of = [row for row in rows if row["method"] == method]
        most = max(row.get("prompts") or 0 for row in rows_of)
        best[method] = max((row for row in rows_of if (row.get("prompts") or 0) == most),
                           key=lambda row: row["speedup"])["settings"]
    return best


def set_items(settings: dict[str, dict]) -> list[str]:
    """{method: settings} as the bench's `--set` items, each value as JSON (a static tree's paths too)."""
    return [item for method, named in settings.items() for name, value in named.items()
            for item in ("--set", f"{method}.{name}={json.dumps(value, separators=(',', ':'))}")]


def in_words(settings: dict) -> str:
    """A candidate's settings on one line, a static tree's paths by their number."""
    return " ".join(f"{name}={f'{len(value)} paths' if isinstance(value, list | tuple) else value}"
                    for name, value in settings.items())


def line(row: dict) -> str:
    settings = in_words(row["settings"]) or "(the device's set)"
    return (f"{row['method']:<12} {settings:<50} {row['tokens_per_forward']:5.2f} tok/pass {row['speedup']:5.2f}x  "
            f"step {row['step_ms']:5.1f} ms (pass {row['target_pass_ms']:4.1f}, AR {row['ar_step_ms']:4.1f})  "
            f"matches {row['matches_ar']:.2f}{on_prompts(row.get('prompts'))}")


def on_prompts(prompts: int | None) -> str:
    """How many prompts a row ran on, in words ("": a report that did not say)."""
    return "" if prompts is None else f" on {prompts} prompt{'' if prompts == 1 else 's'}"


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    parser.add_argument("--per-category", type=int, default=None)
    parser.add_argument("--skip-per-category", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default=None)
    parser.add_argument("--methods", default=",".join(CANDIDATES))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                        help="start no turn, nor a turn's prompt but its first, this many seconds after the sweep "
                             "began, loading included: a sweep stopped from outside loses its turn")
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows --json holds (from a sweep on this device and dtype) and measure the rest")
    parser.add_argument("--chosen", type=Path, default=None, metavar="REPORT",
                        help="print REPORT's best candidate of each method as the bench's --set items, and stop")
    args = parser.parse_args(argv)
    if args.chosen:
        print("\n".join(set_items(chosen(json.loads(args.chosen.read_text())["rows"]))))
        return []
    started = time.monotonic()
    target = load_model(dtype=args.dtype, device=args.device)
    if default_compile(target.device):
        target = compiled(target, progress=lambda message: print(message, file=sys.stderr, flush=True))
    print(f"{target.device}, {args.dtype}; the device's set now: {defaults_for(target.device).name}", flush=True)
    done = earlier(args.json, target) if args.resume else []
    prompts = read_prompts(args.prompts, args.limit, args.per_category, args.skip_per_category)
    rows = sweep(target, prompts, args.max_new_tokens, [name.strip() for name in args.methods.split(",")], args.json,
                 None if args.deadline is None else started + args.deadline, done)
    print("\nbest first:")
    for method in dict.fromkeys(row["method"] for row in rows):
        for row in sorted((row for row in rows if row["method"] == method), key=lambda row: -row["speedup"]):
            print(line(row))
    return rows


if __name__ == "__main__":
    main()
