"""`scripts/gpu_acceptance.py`: the GPU issue's acceptance read from the check's reports, a point a
line, each holding, failing or not measured as its report says."""

import json

from conftest import load_script


def bench(methods: dict, questions: int = 26, failed: dict | None = None) -> dict:
    rows = [{"question_id": q, "method": name} for q in range(questions) for name in methods]
    return {"methods": methods, "rows": rows, **({"failed": failed} if failed else {})}


def stats(speedup: float, per_pass: float = 1.0, matches: float = 1.0, own: float | None = None) -> dict:
    return {"speedup_vs_ar": speedup, "tokens_per_forward": per_pass, "matches_ar": matches,
            "tokens_per_s": 100 * speedup, **({"speedup_vs_own_ar": own} if own is not None else {})}


def verdicts(folder) -> dict[str, str]:
    table = load_script("gpu_acceptance").table(folder)
    return {line.split(" | ")[0].strip("| "): line.rstrip(" |").split(" | ")[-1] for line in table.splitlines()[2:]}


def test_each_point_holds_fails_or_is_not_measured_as_its_report_says(tmp_path):
    (tmp_path / "bench-eager.json").write_text(json.dumps(bench({"ar": stats(1.0), "ar_eager": stats(0.15)})))
    (tmp_path / "passcost.json").write_text(json.dumps({"graphed": {"1": 5.0, "64": 6.0}}))
    (tmp_path / "bench-bf16.json").write_text(json.dumps(bench(
        {"ar": stats(1.0), "speculative": stats(2.1, 2.7), "medusa": stats(1.85, 2.8),
         "cllm": stats(1.7, 2.4, matches=0.9, own=1.81), "cllm_ar": stats(0.95, matches=0.0)},
        failed={"lookahead": "RuntimeError: no graph"})))
    got = verdicts(tmp_path)
    assert got["graphed AR against eager AR (tokens/s)"] == "holds"  # 6.67x
    assert got["a graphed pass of 64 tokens against 1"] == "holds"  # 1.2x
    assert got["`speculative` against graphed AR, bfloat16"] == "FAILS"  # fast enough, too few tokens a pass
    assert got["`medusa` against graphed AR, bfloat16"] == "holds"
    assert got["`lookahead` against graphed AR, bfloat16"] == "not measured"
    assert got["`cllm` against its own AR, bfloat16"] == "holds"  # against its own AR, not the base model's
    assert got["float32: every answer its reference's"] == "not measured"
    assert "failed: RuntimeError: no graph" in load_script("gpu_acceptance").table(tmp_path)


def test_float32_holds_only_with_every_answer_on_all_eight_questions(tmp_path):
    report = tmp_path / "bench-fp32.json"
    every = {"ar": stats(1.0), "speculative": stats(1.9, 2.8), "cllm": stats(1.8, own=1.9),
             "cllm_ar": stats(1.0, 1.0, 0.0)}
    report.write_text(json.dumps(bench(every, questions=8)))  # cllm_ar is AR on other weights: no reference of its own
    assert verdicts(tmp_path)["float32: every answer its reference's"] == "holds"
    report.write_text(json.dumps(bench(every, questions=7)))
    assert verdicts(tmp_path)["float32: every answer its reference's"] == "FAILS"
    report.write_text(json.dumps(bench({**every, "speculative": stats(1.9, 2.8, matches=0.875)}, questions=8)))
    assert verdicts(tmp_path)["float32: every answer its reference's"] == "FAILS"


def test_the_speedups_are_read_again_at_the_sweeps_choice_where_it_chose_other_settings(tmp_path):
    (tmp_path / "bench-bf16.json").write_text(json.dumps(bench(
        {"ar": stats(1.0), "speculative": stats(1.9, 2.9), "medusa": stats(1.7, 2.7)})))
    chosen = bench({"ar": stats(1.0), "speculative": stats(2.05, 3.1)})
    chosen["settings"] = {"ar": {}, "speculative": {"gamma": 6, "static_tree": [[0], [1], [0, 0]]}}
    (tmp_path / "bench-chosen.json").write_text(json.dumps(chosen))
    got = verdicts(tmp_path)
    assert got["`speculative` against graphed AR, bfloat16"] == "FAILS"
    assert got["`speculative` against graphed AR, bfloat16, at the sweep's choice (gamma=6 static_tree=3 paths)"] \
        == "holds"
    assert not any("`medusa`" in what and "choice" in what for what in got)  # the GPU's set: stage 2 is its bench
