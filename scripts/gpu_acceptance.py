"""The GPU issue's acceptance, read from the prepared check's JSON reports (`scripts/gpu_check.sh`):
one line a point, with what was measured, the bound and whether it holds; a point whose report is
missing, or whose run failed, says so. It reads files only, so it runs anywhere:

    python scripts/gpu_acceptance.py REPORTS_FOLDER    # the check's reports.tar.gz, unpacked

Points (issue 68): on the check's bfloat16 bench, graphed AR at least 5x eager AR, a graphed pass
of 64 tokens at most 1.3x a pass of 1, speculative decoding at least 2.0x graphed AR at 2.8 tokens a
pass or more, Medusa at least 1.8x, lookahead 1.4x, the CLLM 1.8x its own AR; in float32 every
method's answers its reference's (the CLLM's: its own AR's) on every question. The speedups are
read at the GPU's set (stage 2), and again at the sweep's choice where it chose other settings
(stage 6d, `bench-chosen.json`: the settings that become the GPU's defaults).
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_sweep import in_words  # noqa: E402

from specdemo.bench import OTHER_WEIGHTS  # noqa: E402

SPEEDUPS = (("speculative", 2.0, 2.8), ("medusa", 1.8, None), ("lookahead", 1.4, None), ("cllm", 1.8, None))


def read(folder: Path, name: str) -> dict | None:
    path = folder / name
    return json.loads(path.read_text()) if path.exists() else None


def point(what: str, measured: str | None, bound: str, holds: bool | None) -> str:
    verdict = "not measured" if holds is None else "holds" if holds else "FAILS"
    return f"| {what} | {measured or '-'} | {bound} | {verdict} |"


def graphs_against_eager(eager: dict | None) -> str:
    methods = (eager or {}).get("methods", {})
    if not {"ar", "ar_eager"} <= methods.keys():
        return point("graphed AR against eager AR (tokens/s)", None, "at least 5x", None)
    ratio = methods["ar"]["tokens_per_s"] / methods["ar_eager"]["tokens_per_s"]
    return point("graphed AR against eager AR (tokens/s)", f"{ratio:.2f}x", "at least 5x", ratio >= 5.0)


def wide_against_narrow(passcost: dict | None) -> str:
    graphed = (passcost or {}).get("graphed", {})
    if not {"1", "64"} <= graphed.keys():
        return point("a graphed pass of 64 tokens against 1", None, "at most 1.3x", None)
    ratio = graphed["64"] / graphed["1"]
    return point("a graphed pass of 64 tokens against 1", f"{ratio:.2f}x", "at most 1.3x", ratio <= 1.3)


def speedups(bench: dict | None, chosen: bool = False) -> list[str]:
    """A line a method of SPEEDUPS; `chosen`: `bench` ran at the sweep's choice, a line for each
    method it ran, naming the settings it changed."""
    methods, failed = (bench or {}).get("methods", {}), (bench or {}).get("failed", {})
    lines = []
    for method, least, per_pass in SPEEDUPS:
        what = f"`{method}` against {'its own AR' if method == 'cllm' else 'graphed AR'}, bfloat16"
        bound = f"at least {least}x" + (f" at {per_pass} tokens a pass" if per_pass else "")
        if chosen:
            if method not in methods and method not in failed:
                continue
            what += f", at the sweep's choice ({in_words(bench['settings'].get(method, {}))})"
        if method not in methods:
            lines.append(point(what, f"failed: {failed[method]}" if method in failed else None, bound, None))
            continue
        stats = methods[method]
        speedup = stats.get("speedup_vs_own_ar", stats["speedup_vs_ar"])
        holds = speedup >= least and (per_pass is None or stats["tokens_per_forward"] >= per_pass)
        lines.append(point(what, f"{speedup:.2f}x at {stats['tokens_per_forward']:.2f} tokens a pass", bound, holds))
    return lines


def exactness(bench: dict | None) -> str:
    methods = (bench or {}).get("methods", {})
    if not methods:
        return point("float32: every answer its reference's", None, "all, on 8 questions", None)
    methods = {name: stats for name, stats in methods.items() if name not in OTHER_WEIGHTS}  # AR on other weights
    differ = [name for name, stats in methods.items() if stats["matches_ar"] < 1.0]
    done = len({row["question_id"] for row in bench.get("rows", [])})
    measured = f"{len(methods) - len(differ)} of {len(methods)} methods on {done} questions" + (
        f"; differing: {', '.join(differ)}" if differ else "")
    holds = not differ and not bench.get("failed") and done == 8
    return point("float32: every answer its reference's", measured, "all, on 8 questions", holds)


def table(folder: Path) -> str:
    lines = ["| the issue's point | measured | bound | verdict |", "| --- | --- | --- | --- |",
             graphs_against_eager(read(folder, "bench-eager.json")), wide_against_narrow(read(folder, "passcost.json")),
             *speedups(read(folder, "bench-bf16.json")), *speedups(read(folder, "bench-chosen.json"), chosen=True),
             exactness(read(folder, "bench-fp32.json"))]
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1])))
