"""The Lesson tab's pass-cost box: what one target pass costs on this machine by the tokens it checks, the page's
model in memory and with its layers on disk, measured when a person asks (`handlers.Handlers.on_measure`), never at
load. Layout and wiring only, as `specdemo.app.ui`'s builders."""

from dataclasses import dataclass
from types import MappingProxyType

import gradio as gr

from specdemo.app.handlers import Handlers
from specdemo.app.wiring import Outputs, wire

TITLE = "What a pass costs on this machine: in memory, and with the layers on disk"
EXPLAINED = (
    "Every method here rests on one fact: a target pass that checks several guessed tokens costs about what a pass "
    "producing one token does. How true that is depends on the machine and the model. Press the button to time one "
    "pass checking 1, 4, 8, 16 and 32 tokens, with the model in memory and with its layers on disk (a model too big "
    "for memory reads all its weights in at every pass). Each line is divided by its own 1-token pass: where a line "
    "stays flat, checking more guesses is nearly free, and speculative decoding gains the most. It can take a minute "
    "or more on a small CPU (the first press also writes the layers to disk), and waits its turn behind the answers "
    "being generated."
)


@dataclass(frozen=True)
class PassCostBox:
    """The Measure button, and what it draws: the sentence and the figure."""

    button: gr.Button
    note: gr.HTML
    plot: gr.Plot

    @property
    def outputs(self) -> Outputs:
        """By the names of `handlers.Handlers.on_measure`'s updates."""
        return {"pass_cost_note": self.note, "pass_cost_plot": self.plot}


def pass_cost_box(offered: bool) -> PassCostBox | None:
    """A closed accordion: what the picture shows, the Measure button, the sentence and the
    figure; none where the page offers no model with its layers on disk (`handlers.Targets.on_disk`)."""
    if not offered:
        return None
    with gr.Accordion(TITLE, open=False, elem_id="pass-cost"):
        gr.Markdown(EXPLAINED)
        button = gr.Button("Measure on this machine", elem_id="measure")
        note = gr.HTML(elem_id="pass-cost-note")
        plot = gr.Plot(label="One target pass's cost by the tokens it checks", elem_id="pass-cost-plot")
    return PassCostBox(button, note, plot)


def wire_pass_cost(box: PassCostBox | None, handlers: Handlers, queue: MappingProxyType) -> None:
    """Measure, in `queue` (the page's decodes' one slot: no answer is timed beside it, nor it beside one)."""
    if box is not None:
        wire(box.button.click, handlers.on_measure, box.outputs, api_visibility="private", trigger_mode="once",
             **queue)
