"""The bench's report: each method's totals over its rows (`aggregate`) and the table it prints (speeds,
tokens a pass, what a step costs, the guesses a pass, the compiled path and the device's defaults)."""

from specdemo.defaults import defaults_for
from specdemo.methods import METHODS

EAGER = {"ar_eager": "ar", "speculative_eager": "speculative", "medusa_eager": "medusa"}
# the same methods on the target with every decoder layer offloaded to disk (`placement`)
OFFLOADED = {"ar_disk": "ar", "speculative_disk": "speculative", "medusa_disk": "medusa", "lookahead_disk": "lookahead"}
# a method that decodes other weights than the target's is checked against AR on those weights,
# an eager twin against eager AR (in bfloat16 the two paths round differently), an offloaded one against offloaded AR
REFERENCES = {"cllm": "cllm_ar", **{twin: "ar_eager" for twin in EAGER if twin != "ar_eager"},
              **{twin: "ar_disk" for twin in OFFLOADED if twin != "ar_disk"}}


def format_table(report: dict) -> str:
    header = (f"{'method':<18}{'tokens':>8}{'passes':>8}{'wall_s':>9}{'tok/s':>9}{'tok/pass':>10}{'speedup':>9}"
              f"{'matches_ar':>12}")
    settings = "; ".join(f"{name} {value}" for name, value in report["settings"].items() if value)
    threads = f" ({report['cpu_threads']} torch threads)" if report.get("cpu_threads") else ""
    title = (f"model {report['model']} on {report['device']}{threads}, {report['dtype']}, "
             f"max_new_tokens {report['max_new_tokens']}")
    lines = [title + (f"; settings: {settings}" if settings else ""), compile_line(report["compiled"]),
             defaults_line(report.get("defaults")), header]
    prompts = report.get("prompts", {})
    if prompts.get("done", 0) < prompts.get("asked", 0):
        lines.insert(-1, f"stopped at its deadline: {prompts['done']} of {prompts['asked']} prompts, "
                         "every method on each")
    for name, s in report["methods"].items():
        lines.append(
            f"{name:<18}{s['tokens']:>8}{s['forward_passes']:>8}{s['wall_s']:>9.2f}{s['tokens_per_s']:>9.2f}"
            f"{s['tokens_per_forward']:>10.2f}{s['speedup_vs_ar']:>8.2f}x{s['matches_ar']:>12.2f}"
        )
    lines += [f"{name:<18}failed, no rows: {why}" for name, why in report.get("failed", {}).items()]
    for name, s in report["methods"].items():
        if name != "ar" and len(s["tokens_per_forward_by_category"]) > 1:
            lines.append(f"{name} tokens/pass by category: "
                         + ", ".join(f"{c} {v:.2f}" for c, v in s["tokens_per_forward_by_category"].items()))
    lines += step_costs(report["methods"])
    lines += guess_lines(report["methods"])
    for name, s in report["methods"].items():
        if name in REFERENCES:
            own = ("AR on the eager path" if name in EAGER else "AR offloaded the same way" if name in OFFLOADED
                   else "AR on its own weights")
            lines.append(
                f"{name}: matches_ar is against {REFERENCES[name]} ({own}); {s['speedup_vs_own_ar']:.2f}x against it; "
                f"its answer differs from the base model's AR on {s['differs_from_base_ar']:.0%} of the prompts"
            )
    for name, s in report["methods"].items():
        if s["divergences"]:
            parts = ", ".join(f"{d['question_id']}@{d['position']} "
                              f"{d['margin']:.3f}{' SUSPECT' if d['margin'] > report['suspect_margin'] else ''}"
                              for d in s["divergences"])
            lines.append(f"{name}: differs on {s['differs']:.0%} of the prompts; first difference (question@token, how "
                         f"far AR's logit preferred its token there): {parts}; max {s['max_divergence_margin']:.3f} (a "
                         f"possible bug above {report['suspect_margin']})")
    if "rounding_noise" in report:
        lines.append(f"rounding noise: a top-two logit gap moved by up to {report['rounding_noise']['max']:.3f} "
                     "between AR's passes and one wide pass over the same text")
    for name in report["methods"]:
        if name in METHODS and METHODS[name].other_answer:
            lines.append(f"{name}: matches_ar is reported, {METHODS[name].other_answer}")
    return "\n".join(lines)


def step_costs(methods: dict) -> list[str]:
    """Where each method's step goes, in milliseconds and in AR passes: the target's pass (wider
    than AR's for a method that verifies proposals) and the rest (proposing, accepting,
    bookkeeping). A speedup is tokens a pass over a step's cost in AR steps, so this says which
    of the two holds a method back."""
    ar_ms = methods["ar"]["step_ms"] if "ar" in methods else 0.0
    lines = []
    for name, s in methods.items():
        if not s["target_s"] or not ar_ms:
            continue
        rest = s["step_ms"] - s["target_pass_ms"]
        lines.append(f"{name}: a step {s['step_ms']:.1f} ms ({s['step_ms'] / ar_ms:.2f} AR steps) = the target's pass "
                     f"{s['target_pass_ms']:.1f} ms ({s['target_pass_ms'] / ar_ms:.2f}) + the rest {rest:.1f} ms "
                     f"({rest / ar_ms:.2f})")
    return lines


def guess_lines(methods: dict) -> list[str]:
    """What a method's pass fed besides the root, by source, and how much of it was accepted: a
    fed token widens the pass (on a CPU, every one costs time) whether it is accepted or not."""
    lines = []
    for name, s in methods.items():
        sources = s.get("guesses_per_pass", {})
        if sources:
            parts = [f"{sum(c['fed']):.2f} {source} ({sum(c['accepted']):.2f} accepted; "
                     f"by depth {' '.join(f'{a:.2f}/{f:.2f}' for a, f in zip(c['accepted'], c['fed']))})"
                     for source, c in sources.items()]
            lines.append(f"{name}: a pass fed " + ", ".join(parts))
    return lines


def defaults_report(device, methods: list[str]) -> dict:
    """The device's set of defaults the run took (`specdemo.defaults`): its name, where it was
    chosen, and what it set for the methods run."""
    defaults, method_of = defaults_for(device), EAGER | OFFLOADED  # a twin takes its method's
    given = {name: dict(defaults.of(method_of.get(name, name))) for name in methods}
    return {"name": defaults.name, "chosen": defaults.chosen, "settings": {name: s for name, s in given.items() if s}}


def compile_report(passes) -> dict:
    """Whether the target's passes were compiled, and how many passes of each bucket width ran
    (0: eager, wider than every bucket: a prompt)."""
    if passes is None:
        return {"on": False}
    return {"on": not passes.failed, "mode": passes.mode or "default", "buckets": list(passes.buckets),
            "passes_by_bucket": dict(sorted(passes.runs.items())),
            **({"failed": passes.failed} if passes.failed else {})}


def defaults_line(defaults: dict | None) -> str:
    if not defaults:  # a report written before the sets of defaults
        return "defaults: the methods' own"
    given = "; ".join(f"{name} {values}" for name, values in defaults["settings"].items())
    return f"defaults: the {defaults['name']} set" + (f" ({given})" if given else " (the methods' own)")


def compile_line(compiled: dict) -> str:
    if not compiled["on"]:
        return "target passes: eager" + (f" (compiling failed: {compiled['failed']})" if compiled.get("failed") else "")
    ran = ", ".join(f"{'eager (wider than every bucket)' if width == 0 else width}: {count}"
                    for width, count in compiled["passes_by_bucket"].items())
    how = "CUDA graphs" if compiled["mode"] == "cuda-graphs" else f"torch.compile, mode {compiled['mode']}"
    return (f"target passes: compiled ({how}), buckets {compiled['buckets']}; passes run by width: {ran} "
            f"({', '.join(EAGER)} and hf_* stay eager)")


def aggregate(methods: list[str], rows: list[dict]) -> dict:
    totals = {}
    for name in methods:
        mine = [row for row in rows if row["method"] == name]
        tokens = sum(row["tokens"] for row in mine)
        passes = sum(row["forward_passes"] for row in mine)
        wall_s = sum(row["wall_s"] for row in mine)
        target_s = sum(row.get("target_s", 0.0) for row in mine)
        totals[name] = {
            "tokens": tokens,
            "forward_passes": passes,
            "wall_s": wall_s,
            "target_s": target_s,
            # a step: one target pass and what the method does around it
            "step_ms": 1e3 * wall_s / passes if passes else 0.0,
            # of which the target's pass (0: not measured)
            "target_pass_ms": 1e3 * target_s / passes if passes else 0.0,
            "tokens_per_s": tokens / wall_s if wall_s else 0.0,
            "tokens_per_forward": tokens / passes if passes else 0.0,
            "matches_ar": sum(row["matches_ar"] for row in mine) / len(mine),
            "tokens_per_forward_by_category": by_category(mine),
            "differs": sum(not row["matches_ar"] for row in mine) / len(mine),
            "divergences": [{"question_id": row["question_id"], **row["divergence"]}
                            for row in mine if row.get("divergence")],
        }
        totals[name]["guesses_per_pass"] = guesses_per_pass(mine, passes)
        margins = [d["margin"] for d in totals[name]["divergences"]]
        totals[name]["max_divergence_margin"] = max(margins) if margins else None
    for name, stats in totals.items():
        stats["speedup_vs_ar"] = stats["tokens_per_s"] / totals["ar"]["tokens_per_s"]
        if name in REFERENCES:  # a changed model: its gain without Jacobi, and how often its answer changed
            stats["speedup_vs_own_ar"] = stats["tokens_per_s"] / totals[REFERENCES[name]]["tokens_per_s"]
            mine = [row for row in rows if row["method"] == name]
            stats["differs_from_base_ar"] = sum(not row["matches_base_ar"] for row in mine) / len(mine)
    return totals


def guesses_per_pass(rows: list[dict], passes: int) -> dict[str, dict[str, list[float]]]:
    """The rows' `guesses_by_source` summed, per target pass: for each source, the tokens fed and
    accepted a pass at each depth."""
    totals: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        for source, counts in row.get("guesses_by_source", {}).items():
            mine = totals.setdefault(source, {"fed": [], "accepted": []})
            for kind in ("fed", "accepted"):
                mine[kind] += [0.0] * (len(counts[kind]) - len(mine[kind]))
                for depth, n in enumerate(counts[kind]):
                    mine[kind][depth] += n / max(passes, 1)
    return totals


def by_category(rows: list[dict]) -> dict[str, float]:
    """Tokens per target pass in each prompt category: where a method's proposals come true."""
    categories = dict.fromkeys(row["category"] for row in rows if row["category"])
    return {
        category: sum(row["tokens"] for row in rows if row["category"] == category)
        / max(1, sum(row["forward_passes"] for row in rows if row["category"] == category))
        for category in categories
    }
