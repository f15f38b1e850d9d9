"""The web page: layout and event wiring only. Decoding lives in the methods; this module
turns their step events into what a person sees."""

import threading
from collections.abc import Iterator

import gradio as gr

from .errors import SpecDemoError
from .events import StepEvent
from .methods import METHODS, get_method, method_options
from .models import LoadedModel

EXAMPLES = [
    "Write a haiku about autumn leaves.",
    "Explain in two sentences why the sky is blue.",
    "Write a Python function that reverses a string.",
    "Translate to French: The library opens at nine in the morning.",
]


def stream_answer(
    target: LoadedModel, prompt: str, max_new_tokens: int, method: str = "ar", stop: threading.Event | None = None
) -> Iterator[str]:
    """The answer's text after each target pass, growing as tokens are committed."""
    input_ids = target.encode_chat(prompt)
    generate, options = get_method(method), method_options(method, target)
    tokens: list[int] = []
    for item in generate(
        target.model, input_ids, max_new_tokens=int(max_new_tokens), eos_token_ids=target.eos_token_ids, stop=stop, **options
    ):
        if isinstance(item, StepEvent):
            tokens += item.committed
            yield target.decode(tokens)


def build_app(target: LoadedModel) -> gr.Blocks:
    """A page with a prompt box, a method picker and the answer streamed as it is decoded."""

    def on_generate(prompt: str, method: str, max_new_tokens: int) -> Iterator[str]:
        try:
            yield from stream_answer(target, prompt, max_new_tokens, method)
        except SpecDemoError as error:  # a sentence for the person, not a traceback
            raise gr.Error(str(error)) from error

    with gr.Blocks(title="SpecDemo") as app:
        gr.Markdown(f"# SpecDemo\nDecoding `{target.spec}` on {target.device} ({target.dtype}).")
        prompt = gr.Textbox(label="Prompt", elem_id="prompt", lines=3, placeholder="Ask something...")
        method = gr.Dropdown(list(METHODS), value="ar", label="Method", elem_id="method")
        max_new_tokens = gr.Slider(1, 1024, value=128, step=1, label="Max new tokens", elem_id="max-new-tokens")
        generate = gr.Button("Generate", variant="primary", elem_id="generate")
        answer = gr.Textbox(label="Answer", elem_id="stream", lines=10, interactive=False)
        gr.Examples(EXAMPLES, inputs=prompt)
        gr.on([generate.click, prompt.submit], on_generate, inputs=[prompt, method, max_new_tokens], outputs=answer, api_name="generate")
    return app
