"""The bench CLI: its JSON schema, its exactness check against AR, and its errors."""

import itertools
import json
import subprocess
import sys
import time

import pytest
import torch

from specdemo import SpecDemoError, bench

from conftest import load_script

TOP_KEYS = {"model", "device", "cpu_threads", "dtype", "max_new_tokens", "compiled", "defaults", "settings", "prompts",
            "methods", "rows", "suspect_margin"}
METHOD_KEYS = {"tokens", "forward_passes", "wall_s", "target_s", "step_ms", "target_pass_ms",
               "tokens_per_s", "tokens_per_forward", "speedup_vs_ar", "matches_ar", "tokens_per_forward_by_category",
               "differs", "divergences", "max_divergence_margin", "guesses_per_pass"}
ROW_KEYS = {"question_id", "category", "method", "tokens", "forward_passes", "wall_s", "target_s", "matches_ar",
            "matches_base_ar", "divergence",
            "guesses_by_source"}


def test_bench_json_schema(embedded, tmp_path):
    out = tmp_path / "out.json"
    argv = ["--methods", "ar,hf_generate,ar_eager", "--limit", "2", "--max-new-tokens", "8", "--dtype", "float32"]
    bench.main([*argv, "--device", "cpu", "--json", str(out)], embedded)
    report = json.loads(out.read_text())
    assert set(report) == TOP_KEYS
    assert report["compiled"] == {"on": False}  # a CPU's default: eager (specdemo.core.static.default_compile)
    assert report["defaults"]["name"] == "CPU" and report["defaults"]["settings"] == {}  # the methods' own
    assert report["methods"].pop("ar_eager")["matches_ar"] == 1.0
    report["rows"] = [row for row in report["rows"] if row["method"] != "ar_eager"]
    assert report["model"] == "embedded" and report["dtype"] == "float32" and report["max_new_tokens"] == 8
    assert set(report["methods"]) == {"ar", "hf_generate"}
    for stats in report["methods"].values():
        assert set(stats) == METHOD_KEYS
        assert stats["tokens"] > 0 and stats["wall_s"] > 0
    assert report["methods"]["ar"]["speedup_vs_ar"] == 1.0
    assert report["methods"]["hf_generate"]["matches_ar"] == 1.0
    assert report["methods"]["hf_generate"]["divergences"] == [] and report["methods"]["hf_generate"]["differs"] == 0.0
    assert report["methods"]["hf_generate"]["forward_passes"] == report["methods"]["hf_generate"]["tokens"]
    assert report["prompts"] == {"asked": 2, "done": 2}
    assert len(report["rows"]) == 4 and all(set(row) == ROW_KEYS for row in report["rows"])
    assert [row["method"] for row in report["rows"]] == ["ar", "hf_generate"] * 2
    # the first two prompts are writing
    assert report["methods"]["ar"]["tokens_per_forward_by_category"] == {"writing": 1.0}
    ar = report["methods"]["ar"]  # our loop times the target's passes; transformers' own loop is not ours to time
    assert 0 < ar["target_s"] < ar["wall_s"] and 0 < ar["target_pass_ms"] < ar["step_ms"]
    assert report["methods"]["hf_generate"]["target_s"] == 0.0


def test_a_deadline_stops_between_prompts_and_reports_those_done(embedded, capsys):
    """Past its deadline the bench starts no more prompts (the first always runs), so a run cut
    short still compares every method on the prompts it finished; one killed from outside reports none."""
    argv = ["--methods", "ar,hf_generate", "--limit", "3", "--max-new-tokens", "4", "--dtype", "float32",
            "--device", "cpu", "--deadline"]
    report = bench.main([*argv, "0"], embedded)
    assert report["prompts"] == {"asked": 3, "done": 1}
    assert [row["method"] for row in report["rows"]] == ["ar", "hf_generate"]
    assert "stopped at its deadline: 1 of 3 prompts" in capsys.readouterr().out
    assert bench.main([*argv, "3600"], embedded)["prompts"] == {"asked": 3, "done": 3}
    assert "stopped at its deadline" not in capsys.readouterr().out


def test_step_costs_split_each_step_into_the_target_pass_and_the_rest():
    methods = {"ar": {"step_ms": 20.0, "target_pass_ms": 19.0, "target_s": 1.9},
               "medusa": {"step_ms": 27.0, "target_pass_ms": 24.0, "target_s": 2.4},
               "hf_generate": {"step_ms": 21.0, "target_pass_ms": 0.0, "target_s": 0.0}}
    lines = bench.step_costs(methods)
    assert len(lines) == 2 and lines[1] == ("medusa: a step 27.0 ms (1.35 AR steps) = the target's pass 24.0 ms (1.20) "
                                            "+ the rest 3.0 ms (0.15)")


def test_guesses_are_reported_per_pass_by_source_and_depth():
    rows = [{"guesses_by_source": {"head": {"fed": [4, 2], "accepted": [2, 1]}, "copy": {"fed": [1], "accepted": [1]}}},
            {"guesses_by_source": {"head": {"fed": [4], "accepted": [1]}}},
            {"guesses_by_source": {}}]
    per_pass = bench.guesses_per_pass(rows, passes=4)
    assert per_pass == {"head": {"fed": [2.0, 0.5], "accepted": [0.75, 0.25]},
                        "copy": {"fed": [0.25], "accepted": [0.25]}}
    lines = bench.guess_lines({"ar": {"guesses_per_pass": {}}, "medusa": {"guesses_per_pass": per_pass}})
    assert lines == ["medusa: a pass fed 2.50 head (1.00 accepted; by depth 0.75/2.00 0.25/0.50), "
                     "0.25 copy (0.25 accepted; by depth 0.25/0.25)"]


def test_tokens_per_pass_by_category():
    rows = [
        {"category": "math", "tokens": 10, "forward_passes": 4},
        {"category": "rag", "tokens": 9, "forward_passes": 3},
        {"category": "math", "tokens": 6, "forward_passes": 4},
    ]
    assert bench.by_category(rows) == {"math": 2.0, "rag": 3.0}


def test_default_prompt_file_covers_the_categories():
    rows = bench.read_prompts(bench.DEFAULT_PROMPTS, None)
    categories = {row["category"] for row in rows}
    assert len(rows) >= 30
    assert {"writing", "coding", "math", "qa", "summarization", "translation", "rag"} <= categories


def test_a_sample_per_category_may_skip_each_categorys_first_rows(tmp_path):
    """`--per-category 1 --skip-per-category 2`: the third row of each category that has one, a
    sample apart from `--per-category 2`'s (the GPU sweep's questions, apart from the bench's)."""
    path = tmp_path / "prompts.jsonl"
    rows = [{"question_id": q, "category": category, "turns": ["hi"]}
            for q, category in enumerate(["a", "b", "a", "a", "b", "a", "c"])]
    path.write_text("\n".join(map(json.dumps, rows)))
    assert [row["question_id"] for row in bench.read_prompts(path, None, 1, 2)] == [3]
    assert [row["question_id"] for row in bench.read_prompts(path, None, 2, 1)] == [2, 3, 4]
    assert [row["question_id"] for row in bench.read_prompts(path, None, 2)] == [0, 1, 2, 4, 6]
    with pytest.raises(SpecDemoError, match="skip-per-category"):
        bench.read_prompts(path, None, 1, -1)


def test_ar_always_runs_first():
    assert bench.parse_methods("hf_generate") == ["ar", "hf_generate"]
    assert bench.parse_methods("hf_generate,ar,ar") == ["ar", "hf_generate"]


def test_unknown_method_fails_with_the_known_ones():
    result = subprocess.run(
        [sys.executable, "-m", "specdemo.bench", "--methods", "ar,warp_drive"], capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "warp_drive" in result.stderr and "hf_generate" in result.stderr and "Traceback" not in result.stderr


def test_method_settings_reach_the_method(embedded, tmp_path):
    out = tmp_path / "out.json"
    argv = ["--methods", "jacobi", "--limit", "1", "--max-new-tokens", "6", "--dtype", "float32", "--device", "cpu"]
    report = bench.main([*argv, "--set", "jacobi.block_size=3", "--json", str(out)], embedded)
    assert report["settings"] == {"ar": {}, "jacobi": {"block_size": 3}}
    assert report["methods"]["jacobi"]["matches_ar"] == 1.0
    with pytest.raises(SpecDemoError, match="block_size"):  # the value reaches the method, which checks it
        bench.main([*argv, "--set", "jacobi.block_size=0"], embedded)


def test_bad_setting_is_refused():
    with pytest.raises(SpecDemoError, match="METHOD.SETTING=VALUE"):
        bench.parse_settings(["window=5"], ["ar", "lookahead"])
    with pytest.raises(SpecDemoError, match="medusa.width"):
        bench.parse_settings(["medusa.width=5"], ["ar", "lookahead"])
    # a misspelt setting, or one the bench loads itself, is refused before any model loads, naming the right ones
    with pytest.raises(SpecDemoError, match="no setting 'windw'.*window, ngram"):
        bench.parse_settings(["lookahead.windw=5"], ["ar", "lookahead"])
    with pytest.raises(SpecDemoError, match="no setting 'draft'"):
        bench.parse_settings(["speculative.draft=other"], ["ar", "speculative"])
    assert bench.parse_settings(["lookahead.window = 5"], ["ar", "lookahead"])["lookahead"] == {"window": 5}
    # transformers checks its own
    assert bench.parse_settings(["hf_generate.top_k=4"], ["ar", "hf_generate"])["hf_generate"] == {"top_k": 4}


def test_cllm_is_checked_against_ar_on_its_own_weights(embedded):
    """cllm brings its reference, cllm_ar (AR on the CLLM weights); its matches_ar is against
    that, and the report says how often its answer is not the base model's."""
    assert bench.parse_methods("cllm") == ["ar", "cllm", "cllm_ar"]
    argv = ["--methods", "cllm", "--limit", "2", "--max-new-tokens", "12", "--dtype", "float32", "--device", "cpu"]
    report = bench.main(argv, embedded)
    cllm = report["methods"]["cllm"]
    assert cllm["matches_ar"] == 1.0 and {"speedup_vs_own_ar", "differs_from_base_ar"} <= set(cllm)
    rows = [row for row in report["rows"] if row["method"] == "cllm"]
    assert cllm["differs_from_base_ar"] == sum(not row["matches_base_ar"] for row in rows) / len(rows)


def test_ar_on_the_cllms_weights_is_not_explained_as_a_divergence(embedded):
    """cllm_ar is another model's AR: where it parts from the base model's AR is by design, so the
    bench does not explain it (nor flag its margin as a possible bug); a method that should give
    AR's answer and parts the same way is explained."""
    input_ids = embedded.encode_chat("Name a colour.")
    answer = list(bench.RUNNERS["ar"](embedded, input_ids, 6).tokens)
    parted = [*answer[:3], (answer[3] + 1) % embedded.model.config.vocab_size, *answer[4:]]
    explained = bench.explain_differences(embedded, input_ids, ["ar", "lookahead", "cllm_ar"],
                                          {"ar": answer, "lookahead": parted, "cllm_ar": parted})
    assert set(explained) == {"lookahead"} and explained["lookahead"].position == 3


def test_beam_and_contrastive_run_with_matches_ar_reported(embedded, capsys):
    """The classic strategies go through the same bench; their matches_ar is reported, not expected."""
    argv = ["--methods", "beam,contrastive", "--limit", "1", "--max-new-tokens", "10", "--dtype", "float32",
            "--device", "cpu", "--set", "beam.num_beams=2"]
    report = bench.main(argv, embedded)
    assert report["methods"]["beam"]["forward_passes"] > 0 and report["methods"]["contrastive"]["tokens"] > 0
    assert report["settings"]["beam"] == {"num_beams": 2}
    printed = capsys.readouterr().out
    assert "beam: matches_ar is reported, not expected" in printed and "contrastive: matches_ar is reported" in printed


def test_the_report_says_which_buckets_ran():
    from collections import Counter

    from specdemo.core.static import CompiledPass

    passes = CompiledPass(forward=None, buckets=(1, 8, 16), mode=None, runs=Counter({1: 30, 8: 4, 0: 1}))
    report = bench.compile_report(passes)
    assert report == {"on": True, "mode": "default", "buckets": [1, 8, 16], "passes_by_bucket": {0: 1, 1: 30, 8: 4}}
    line = bench.compile_line(report)
    assert "compiled" in line and "1: 30" in line and "8: 4" in line and "eager (wider than every bucket): 1" in line
    passes.failed = "RuntimeError: no compiler"
    assert bench.compile_line(bench.compile_report(passes)).startswith(
        "target passes: eager (compiling failed: RuntimeError")
    assert bench.compile_line(bench.compile_report(None)) == "target passes: eager"


def test_an_eager_twin_is_measured_against_eager_ar(embedded):
    """`speculative_eager` brings `ar_eager` along; it must give eager AR's answer, and its speedup
    is reported against it as well as against `ar`."""
    argv = ["--methods", "ar,speculative_eager", "--limit", "1", "--max-new-tokens", "8", "--dtype", "float32",
            "--device", "cpu"]
    report = bench.main(argv, embedded)
    assert list(report["methods"]) == ["ar", "speculative_eager", "ar_eager"]
    twin, eager_ar = report["methods"]["speculative_eager"], report["methods"]["ar_eager"]
    assert twin["matches_ar"] == 1.0 and twin["tokens_per_forward"] > 1.0
    assert twin["speedup_vs_own_ar"] == pytest.approx(twin["tokens_per_s"] / eager_ar["tokens_per_s"])


@pytest.mark.slow
def test_an_offloaded_twin_is_measured_against_ar_offloaded_the_same_way(embedded):
    """`medusa_disk` runs Medusa on the target with every decoder layer on disk and brings `ar_disk`
    along: it gives offloaded AR's answer (float32), and its speedup is reported against it."""
    argv = ["--methods", "ar,medusa_disk", "--limit", "1", "--max-new-tokens", "8", "--dtype", "float32",
            "--device", "cpu"]
    report = bench.main(argv, embedded)
    assert list(report["methods"]) == ["ar", "medusa_disk", "ar_disk"]
    twin, offloaded_ar = report["methods"]["medusa_disk"], report["methods"]["ar_disk"]
    assert twin["matches_ar"] == 1.0 and twin["differs_from_base_ar"] == 0.0 and twin["tokens_per_forward"] > 1.0
    assert twin["speedup_vs_own_ar"] == pytest.approx(twin["tokens_per_s"] / offloaded_ar["tokens_per_s"])
    assert "AR offloaded the same way" in bench.format_table(report)


def test_the_gpu_sweep_benches_each_candidate_against_ar(embedded, tmp_path):
    """`scripts/gpu_sweep.py`, which chooses a device's defaults: a row a candidate, each from a bench
    run against AR, kept in its JSON as it goes; on the embedded model in float32 each answer is AR's."""
    sweep = load_script("gpu_sweep")
    out = tmp_path / "sweep.json"
    rows = sweep.sweep(embedded, bench.read_prompts(bench.DEFAULT_PROMPTS, 1), 6, ["lookahead"], out)
    assert [row["settings"] for row in rows] == sweep.CANDIDATES["lookahead"]
    assert all(row["matches_ar"] == 1.0 and row["tokens_per_forward"] >= 1 and row["speedup"] > 0 for row in rows)
    assert json.loads(out.read_text())["rows"] == rows


def test_a_gpu_sweep_candidate_that_fails_is_told_and_the_sweep_goes_on(embedded, monkeypatch, capsys):
    sweep = load_script("gpu_sweep")
    monkeypatch.setitem(bench.RUNNERS, "cllm", failing(bench.RUNNERS["cllm"], "cllm", 0, RuntimeError("no graph")))
    rows = sweep.sweep(embedded, bench.read_prompts(bench.DEFAULT_PROMPTS, 1), 4, ["cllm", "lookahead"])
    assert {row["method"] for row in rows} == {"lookahead"} and len(rows) == len(sweep.CANDIDATES["lookahead"])
    assert capsys.readouterr().out.count("failed, RuntimeError: no graph") == len(sweep.CANDIDATES["cllm"])


def test_the_gpu_sweep_takes_the_methods_in_turns():
    """A turn holds the next candidate of each method, so a sweep cut short by its time limit has
    the first candidates of every method."""
    sweep = load_script("gpu_sweep")
    lookahead, cllm = sweep.CANDIDATES["lookahead"], sweep.CANDIDATES["cllm"]
    turns = sweep.turns(["lookahead", "cllm"])
    assert turns[:2] == [[("lookahead", lookahead[0]), ("cllm", cllm[0])],
                         [("lookahead", lookahead[1]), ("cllm", cllm[1])]]
    assert len(turns) == max(len(lookahead), len(cllm))
    assert sorted(map(str, itertools.chain(*turns))) == sorted(map(str, [*(("lookahead", s) for s in lookahead),
                                                                         *(("cllm", s) for s in cllm)]))


def test_a_resumed_gpu_sweep_measures_only_what_the_earlier_one_did_not(tmp_path):
    """`--resume`: the rows of an earlier sweep's report on this device and dtype are kept, and
    their candidates (a static tree's paths read back from JSON as lists) leave the turns."""
    sweep = load_script("gpu_sweep")
    speculative = sweep.CANDIDATES["speculative"]
    static = next(settings for settings in speculative if isinstance(settings.get("static_tree"), tuple))
    measured = (speculative[0], static)
    rows = [{"method": "speculative", "settings": json.loads(json.dumps(settings))} for settings in measured]
    report = tmp_path / "sweep.json"
    report.write_text(json.dumps({"device": "cpu", "dtype": "torch.float32", "rows": rows}))
    target = type("Target", (), {"device": torch.device("cpu"), "dtype": torch.float32})
    done = sweep.earlier(report, target)
    assert done == rows and sweep.earlier(tmp_path / "none.json", target) == []
    assert sweep.earlier(report, type("Target", (), {"device": torch.device("cpu"), "dtype": torch.bfloat16})) == []
    left = list(itertools.chain(*sweep.turns(["speculative", "medusa"], done)))
    assert [settings for method, settings in left if method == "speculative"] == [
        settings for settings in speculative if settings not in measured]
    assert [settings for method, settings in left if method == "medusa"] == sweep.CANDIDATES["medusa"]


def test_the_gpu_sweeps_choice_is_each_methods_fastest_candidate_as_the_benchs_settings():
    """`gpu_sweep.py --chosen`: a method's candidate of highest speedup among those measured on the
    most prompts, as `--set` items the bench reads back into the same settings (a static tree's paths too)."""
    sweep = load_script("gpu_sweep")
    static = next(settings for settings in sweep.CANDIDATES["speculative"] if settings.get("static_tree"))
    rows = [{"method": "speculative", "settings": json.loads(json.dumps(static)), "speedup": 1.9, "prompts": 8},
            {"method": "speculative", "settings": {"gamma": 7}, "speedup": 2.4, "prompts": 3},  # cut short
            {"method": "speculative", "settings": {}, "speedup": 1.7, "prompts": 8},
            {"method": "medusa", "settings": {}, "speedup": 1.8, "prompts": 8}]
    chosen = sweep.chosen(rows)
    assert chosen == {"speculative": rows[0]["settings"], "medusa": {}}
    items = sweep.set_items(chosen)
    assert items[::2] == ["--set"] * len(static)
    assert bench.parse_settings(items[1::2], ["ar", "speculative", "medusa"]) == {"ar": {}, **chosen}


def test_a_gpu_sweep_past_its_deadline_ends_after_its_first_turn_and_prompt(embedded):
    """A deadline passed already: the first turn runs its first prompt, every method's candidate on
    it, and no other turn starts."""
    sweep = load_script("gpu_sweep")
    rows = sweep.sweep(embedded, bench.read_prompts(bench.DEFAULT_PROMPTS, 2), 4, ["lookahead", "cllm"],
                       deadline=time.monotonic())
    assert [(row["method"], row["settings"], row["prompts"]) for row in rows] == [
        ("lookahead", sweep.CANDIDATES["lookahead"][0], 1), ("cllm", sweep.CANDIDATES["cllm"][0], 1)]


def test_host_cost_counts_only_the_work_outside_the_replays(embedded):
    """`scripts/host_cost.py`, the host's share of a step on the graph path: every pass after the
    prompt's replays a stand-in graph, Medusa's heads and a draft tree's levels too (static, and
    grown on the device as deep as EAGLE-3's), and what it counts excludes the replays and the
    prompt's pass (a decoder layer's or a head's SiLU runs only inside them; the feature draft's
    one layer runs eagerly over the prompt's pairs, wider than its widest graph, as the prompt's
    pass is learned). The stand-ins refuse what CUDA's capture would (`test_graphs.Capturable`):
    the embedded model's companions run there as on a GPU."""
    host_cost = load_script("host_cost")
    clock = host_cost.Clock()
    graphed, functions = host_cost.stand_ins(clock)
    passes = graphed(embedded.model, (1, 8, 16), "target")
    dynamic = {"gamma": 7, "draft_tree_size": 60, "draft_tree_top_k": 10}
    for name, settings in (("ar", {}), ("medusa", {}), ("speculative", {"static_tree": True, "gamma": 3}),
                           ("speculative", dynamic)):
        ops = host_cost.Operations(clock)
        outside, steps, *_ = host_cost.measure(embedded, name, passes, graphed, functions, clock, 6, (ops,), settings)
        assert steps >= len(host_cost.PROMPTS) and outside > 0 and sum(ops.kinds.values()) > 0
        assert 0 < ops.seconds < outside  # the operations' own time, a part of the step's outside the replays
        assert ops.kinds["silu"] == 0 and clock.inside > 0  # no decoder layer ran outside a replay


def failing(runner, name: str, runs: int, error: Exception):
    """`runner`, which raises `error` from its call number `runs` + 1 on."""
    calls = []

    def run(*args, **settings):
        calls.append(name)
        if len(calls) > runs:
            raise error
        return runner(*args, **settings)

    return run


def test_a_method_that_fails_costs_its_own_rows_not_the_bench(embedded, monkeypatch, capsys):
    """A method whose run raises (on a GPU, a capture or a kernel that fails) is dropped, with why,
    its rows and those of the methods measured against it; the others are measured on every prompt.
    A sentence for the person (a setting refused) and AR's failure still end the bench."""
    cuda_error = RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors ...")
    monkeypatch.setitem(bench.RUNNERS, "lookahead", failing(bench.RUNNERS["lookahead"], "lookahead", 2, cuda_error))
    monkeypatch.setitem(bench.RUNNERS, "ar_eager", failing(bench.RUNNERS["ar_eager"], "ar_eager", 0, cuda_error))
    argv = ["--methods", "ar,lookahead,medusa_eager", "--limit", "2", "--max-new-tokens", "6", "--dtype", "float32",
            "--device", "cpu"]
    report = bench.main(argv, embedded)
    why = "RuntimeError: CUDA error: an illegal memory access was encountered"
    # lookahead warmed up and ran the first prompt, then failed; the eager twins never ran
    assert report["failed"] == {"ar_eager": why, "medusa_eager": "its reference ar_eager failed", "lookahead": why}
    assert list(report["methods"]) == ["ar"] and [row["method"] for row in report["rows"]] == ["ar", "ar"]
    assert report["prompts"] == {"asked": 2, "done": 2}
    out, err = capsys.readouterr()
    assert f"lookahead         failed, no rows: {why}" in out
    assert "lookahead failed; the bench goes on without it" in err
    monkeypatch.setitem(bench.RUNNERS, "lookahead", failing(bench.RUNNERS["ar"], "lookahead", 0, SpecDemoError("no")))
    with pytest.raises(SpecDemoError):
        bench.main(argv, embedded)
    monkeypatch.setitem(bench.RUNNERS, "ar", failing(bench.RUNNERS["ar"], "ar", 0, cuda_error))
    with pytest.raises(RuntimeError):
        bench.main(argv, embedded)
