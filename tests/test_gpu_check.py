"""`scripts/gpu_check.sh`, the prepared GPU check: a lent GPU is rare and short, so the script must
parse and run here, and `ONLY` must run the stages it names and no other."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def check(out: Path, only: str, before: Path | None = None) -> str:
    env = {**os.environ, "ONLY": only, "TOTAL": "8", "PYTHON": sys.executable, "PYTHONPATH": str(ROOT),
           **({"BEFORE": str(before)} if before else {})}
    subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out)], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=120)
    return (out / "gpu-check.md").read_text()


def test_the_check_parses_and_only_runs_the_stages_it_is_given(tmp_path):
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu_check.sh")], check=True)
    printed = check(tmp_path / "none", "none")
    assert "torch" in printed and printed.rstrip().endswith("done")
    assert not any(line.split("] ", 1)[-1][:2].rstrip(".").isdigit() for line in printed.splitlines())
    before = tmp_path / "before"  # a tree before a change without its code: its stage starts and fails at once
    (before / "specdemo").mkdir(parents=True)
    (before / "REVISION").write_text("abc1234\n")
    printed = check(tmp_path / "late", "8", before)
    stages = [line.split("] ", 1)[1].split(".")[0] for line in printed.splitlines() if line.startswith("[")
              and line.split("] ", 1)[1][:1].isdigit()]
    assert stages == ["8"] and "before: abc1234" in printed
