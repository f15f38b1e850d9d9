"""SpecDemo: see and measure how LLMs decode faster without losing quality.

One target model, several decoding methods; each method is a generator of step events
(`specdemo.core.events`), one per target forward pass, which the app, the benchmark and the
tests all consume.
"""

from specdemo.core.errors import SpecDemoError
from specdemo.core.events import StepEvent, Summary, final_summary
from specdemo.core.sampling import GREEDY, SamplingConfig
from specdemo.methods import METHODS, get_method
from specdemo.models import EMBEDDED, LoadedModel, load_model

__all__ = [
    "EMBEDDED",
    "GREEDY",
    "METHODS",
    "LoadedModel",
    "SamplingConfig",
    "SpecDemoError",
    "StepEvent",
    "Summary",
    "final_summary",
    "get_method",
    "load_model",
]
