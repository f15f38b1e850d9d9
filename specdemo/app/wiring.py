"""How a handler's updates reach the page: a handler returns or yields dicts keyed by name
(`specdemo.app.handlers`, `specdemo.app.one_run`), free of Gradio's components; an event is
wired with its outputs by the same names (`specdemo.app.ui`), and `keyed` gives Gradio each
update keyed by component. An output an update does not name stays as it is."""

import contextlib
import functools
import inspect
from collections.abc import Callable

import gradio as gr
from gradio.events import Dependency

from specdemo.app.live import let_workers_go

Outputs = dict[str, gr.components.Component]  # an event's outputs, by the names its handler's updates use


def keyed(handler: Callable, outputs: Outputs) -> Callable:
    """`handler` as Gradio calls it: each update it returns or yields (a dict keyed by name) keyed
    instead by the components `outputs` names so, which Gradio matches to the event's outputs and
    leaves the others as they are. A name `outputs` lacks raises: the handler and its wiring disagree.
    Gradio runs each step of a handler in one of its worker threads, which then waits for the next:
    the thread lets its OpenMP workers go before it hands an update over (`live.let_workers_go`),
    so no idle thread slows a run that decodes meanwhile."""

    def by_component(update: dict):
        # to Gradio, {} is too few values; skip() leaves them all
        return {outputs[name]: value for name, value in update.items()} or gr.skip()

    if inspect.isgeneratorfunction(handler):  # streamed: Gradio streams only from a generator function
        @functools.wraps(handler)
        def streamed(*values):
            # Stop closes this generator, and with it the handler's
            try:
                with contextlib.closing(handler(*values)) as updates:
                    for update in updates:
                        let_workers_go()
                        yield by_component(update)
            finally:
                let_workers_go()
        return streamed

    @functools.wraps(handler)
    def answered(*values):
        try:
            return by_component(handler(*values))
        finally:
            let_workers_go()
    return answered


def wire(listener: Callable, handler: Callable, outputs: Outputs, **options) -> Dependency:
    """`handler` on `listener` (an event, `.then`, or `gr.on` with its triggers), its updates to `outputs` by name."""
    return listener(keyed(handler, outputs), outputs=list(outputs.values()), **options)
