"""SpecDemo: see and measure how LLMs decode faster without losing quality.

One target model, several decoding methods; each method is a generator of step events
(`specdemo.events`), one per target forward pass, which the app, the benchmark and the
tests all consume.
"""

from .errors import SpecDemoError
from .events import StepEvent, Summary, final_summary
from .methods import METHODS, get_method
from .models import EMBEDDED, LoadedModel, load_model
from .sampling import GREEDY, SamplingConfig

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
