"""The stop rules every method shares: EOS ends the answer, max_new_tokens caps it."""

from specdemo.core.recorder import StepRecorder


def test_eos_inside_a_multi_token_step_cuts_after_it():
    recorder = StepRecorder("speculative", max_new_tokens=50, eos_token_ids=[2])
    event = recorder.step(committed=[7, 8, 2, 9], proposed=[7, 8, 2, 9], accepted=[7, 8, 2])
    assert event.committed == (7, 8, 2) and event.accepted == (7, 8, 2)
    assert recorder.done and recorder.summary().finish_reason == "eos"


def test_length_cap_cuts_a_multi_token_step():
    recorder = StepRecorder("speculative", max_new_tokens=5, eos_token_ids=[2])
    recorder.step(committed=[4, 4, 4])
    event = recorder.step(committed=[5, 6, 7, 8], proposed=[5, 6, 7], accepted=[5, 6, 7], rejected=[])
    assert event.committed == (5, 6) and event.accepted == (5, 6)
    summary = recorder.summary()
    assert summary.tokens == (4, 4, 4, 5, 6) and summary.finish_reason == "length"
    assert summary.target_forwards == 2 and summary.proposed == 3 and summary.accepted == 2


def test_eos_as_the_last_allowed_token_is_eos():
    recorder = StepRecorder("ar", max_new_tokens=2, eos_token_ids=[2])
    recorder.step(committed=[3])
    recorder.step(committed=[2])
    assert recorder.summary().finish_reason == "eos"


def test_an_eos_past_the_length_cap_is_not_the_answer_s_end():
    """A pass may commit past max_new_tokens; an EOS there is cut off with the rest, so the answer
    ended by length, as AR's does (it never reaches that EOS)."""
    recorder = StepRecorder("medusa", max_new_tokens=3, eos_token_ids=[2])
    event = recorder.step(committed=[5, 6, 7, 2], proposed=[5, 6, 7], accepted=[5, 6, 7])
    assert event.committed == (5, 6, 7) and recorder.summary().finish_reason == "length"


def test_room_after_a_pass_is_none_once_the_pass_ends_the_answer():
    """What a proposer learns of the room left (`loop.Proposer.learn`): none after an EOS or the
    length cap, else what the cap leaves; it changes nothing."""
    recorder = StepRecorder("speculative", max_new_tokens=5, eos_token_ids=[2])
    assert recorder.room_after(recorder.kept([4, 4])) == 3
    assert recorder.room_after(recorder.kept([4, 2, 9])) == 0
    assert recorder.room_after(recorder.kept([4, 4, 4, 4, 4, 4])) == 0
    assert recorder.room == 5 and not recorder.done
