"""`scripts/gpu_check.sh`, the prepared GPU check: a lent GPU is rare and short, so the script must
parse and run here, and `ONLY` must run the stages it names and no other."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def check(out: Path, only: str, before: Path | None = None, reports: Path | None = None) -> str:
    env = {**os.environ, "ONLY": only, "TOTAL": "8", "PYTHON": sys.executable, "PYTHONPATH": str(ROOT),
           **({"BEFORE": str(before)} if before else {}), **({"REPORTS": str(reports)} if reports else {})}
    subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out)], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=120)
    return (out / "gpu-check.md").read_text()


def stages(printed: str) -> list[str]:
    """The stages a check's output says it began ("[12s] 6b. what a fresh process pays..." is 6b)."""
    return re.findall(r"^\[\d+s\] (\d+[a-z]?)\. ", printed, flags=re.M)


def test_the_check_parses_and_only_runs_the_stages_it_is_given(tmp_path):
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu_check.sh")], check=True)
    printed = check(tmp_path / "none", "none")
    assert "torch" in printed and printed.rstrip().endswith("done") and stages(printed) == []
    before = tmp_path / "before"  # a tree before a change without its code: its stage starts and fails at once
    (before / "specdemo").mkdir(parents=True)
    (before / "REVISION").write_text("abc1234\n")
    printed = check(tmp_path / "late", "8", before)
    assert stages(printed) == ["8"] and "before: abc1234" in printed


def test_a_later_call_on_a_fresh_machine_says_to_carry_the_parts_again(tmp_path):
    """A machine that went back between calls comes back bare: without the parts' transformers the
    check stops at once and says why, where every stage would fail on its own."""
    bare = tmp_path / "python"  # a Python that imports nothing
    bare.write_text("#!/bin/sh\nexit 1\n")
    bare.chmod(0o755)
    env = {**os.environ, "ONLY": "2", "TOTAL": "8", "PYTHON": str(bare)}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path / "out")], cwd=ROOT, env=env,
                          capture_output=True, timeout=60)
    assert done.returncode == 1
    assert "carry the three parts again" in (tmp_path / "out" / "gpu-check.md").read_text()


def test_the_bench_at_the_sweeps_choice_runs_the_methods_it_chose_other_settings_for(tmp_path):
    """Stage 6d benches each method's best candidate of the sweep (`gpu_sweep.py --chosen`), only where
    that is not the GPU's set, which stage 2 benched."""
    reports = tmp_path / "reports"
    reports.mkdir()
    rows = [{"method": "speculative", "settings": {}, "speedup": 1.5, "prompts": 8},
            {"method": "speculative", "settings": {"gamma": 7}, "speedup": 1.9, "prompts": 8},
            {"method": "medusa", "settings": {}, "speedup": 1.7, "prompts": 8},
            {"method": "medusa", "settings": {"tree_size": 63}, "speedup": 1.6, "prompts": 8}]
    (reports / "sweep.json").write_text(json.dumps({"device": "cuda:0", "dtype": "torch.bfloat16", "rows": rows}))
    printed = check(tmp_path / "chose", "6d", reports=reports)
    said = next(line for line in printed.splitlines() if " 6d. " in line)
    assert stages(printed) == ["6d"] and said.endswith(": --set speculative.gamma=7")
    (reports / "sweep.json").write_text(json.dumps({"device": "cuda:0", "dtype": "torch.bfloat16", "rows": rows[2:]}))
    printed = check(tmp_path / "same", "6d", reports=reports)
    assert stages(printed) == ["6d"] and printed.count("the GPU set, benched in 2") == 1
