"""The page's handler streams a growing answer from the embedded model (no browser needed)."""

import gradio as gr

from specdemo import ar
from specdemo.events import final_summary
from specdemo.ui import build_app, stream_answer


def test_stream_answer_grows_to_the_full_answer(embedded):
    texts = list(stream_answer(embedded, "Say hello.", max_new_tokens=12))
    input_ids = embedded.encode_chat("Say hello.")
    summary = final_summary(ar.generate(embedded.model, input_ids, max_new_tokens=12, eos_token_ids=embedded.eos_token_ids))
    assert len(texts) == summary.target_forwards  # one update per target pass
    assert texts[-1] == embedded.decode(summary.tokens) and texts[-1].strip()
    assert len(texts[0]) < len(texts[-1])


def test_build_app(embedded):
    assert isinstance(build_app(embedded), gr.Blocks)


def test_stream_answer_with_speculative_ends_on_the_ar_answer(embedded):
    ar_text = list(stream_answer(embedded, "Name three colors.", max_new_tokens=16))[-1]
    speculative_texts = list(stream_answer(embedded, "Name three colors.", max_new_tokens=16, method="speculative"))
    assert speculative_texts[-1] == ar_text
    assert len(speculative_texts) < 16  # several tokens per target pass
