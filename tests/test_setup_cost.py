"""`scripts/setup_cost.py`, the prepared GPU check's measure of what a fresh process pays before its
first token, run on a CPU without its graphs: every part is timed and written as it ends, and a
method's second answer equals its first."""

import json

from conftest import load_script


def test_every_part_of_a_fresh_process_is_timed_and_written(tmp_path):
    out = tmp_path / "setup.json"
    found = load_script("setup_cost").main(["--no-compile", "--dtype", "float32", "--methods", "ar,speculative,cllm",
                                            "--tokens", "4", "--json", str(out)])
    parts = found["parts"]
    assert list(parts) == ["the target onto the device",
                           *(f"{name}: {part}" for name in ("ar", "speculative", "cllm")
                             for part in ("its companions", "its first answer of 4 tokens",
                                          "its second answer of 4 tokens"))]
    assert all(seconds >= 0 for seconds in parts.values())
    assert json.loads(out.read_text()) == parts
    for first, second in found["answers"].values():
        assert first == second and len(first) == 4


def test_a_method_that_fails_is_told_and_the_others_are_still_timed(monkeypatch, capsys):
    script = load_script("setup_cost")
    measured = script.method_parts

    def method_parts(target, name, *args):
        if name == "medusa":
            raise RuntimeError("operation not permitted when stream is capturing\nmore")
        return measured(target, name, *args)

    monkeypatch.setattr(script, "method_parts", method_parts)
    found = script.main(["--no-compile", "--dtype", "float32", "--methods", "medusa,ar", "--tokens", "2"])
    assert list(found["answers"]) == ["ar"]
    assert "medusa: failed: RuntimeError: operation not permitted when stream is capturing" in capsys.readouterr().out
