"""The lesson: the page's guided order for a class (docs/lesson.md is the teacher's plan). Data
only: each step names a method, a prompt on which that method's gain shows, and what to look
at. The page's handlers read it; nothing here decodes or draws."""

import html
from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    title: str
    method: str  # the method Generate runs ("" for the race, which runs them all)
    prompt: str
    max_new_tokens: int
    notice: str  # what to look at, in plain words
    model: str = ""  # the model the step runs on, a name of the page's model menu ("": the model the page started with)


GLOSSARY = (
    "**Target**: the language model whose answer we want. **Pass**: one run of the target over the text so far; "
    "checking a few extra tokens in a pass costs about as much as producing one. **Draft** (or guess): tokens proposed "
    "cheaply, which the target checks in one pass, keeping those it would have written itself. **Speedup**: tokens per "
    "second against AR's on the same prompt, timed the same way."
)

# Prompts on which each method's gain shows, chosen by tokens per target pass with the embedded
# model, 64 tokens (docs/lesson.md), among prompts whose answers the model never wrote before:
# none of them is in a datastore or a training plan (tests/test_lesson_prompts.py).
CODE = "Write a Python function that counts how many times a letter appears in a word, with a docstring."
LIST = "List the days of the week, one per line."
REUSE = "Write a Python function that returns the largest of three numbers, with a docstring."

# The page's model offered again with its decoder layers on disk (`handlers.Targets`), where it is the embedded one.
ON_DISK = "SmolLM2-135M, layers on disk (stands in for a model too big for memory)"
ON_DISK_ABOUT = (
    "The page's model with every decoder layer kept on disk instead of in memory, as a model too big for this "
    "machine's memory would be: each target pass reads all of its layers' weights in again, whatever it checks. Its "
    "passes are slower, but a pass checking 16 tokens costs about what a pass of 1 does, so every method that checks "
    "several tokens a pass gains more here than in memory. Same weights, same answers; loaded on first use."
)

LESSON = (
    Step("1. One token a pass (AR)", "ar", CODE, 64,
         "Every token is grey: one target pass made each. Note the speed: the range beside the speedup (about 1.0x "
         "here, AR against itself) is how much the timing wobbles on its own."),
    Step("2. A draft guesses, the target checks (speculative)", "speculative", CODE, 64,
         "Green tokens were guessed by the small draft and accepted by the target; red ones were rejected. Tokens per "
         "pass is above 1: that is the whole trick. The answer is exactly AR's."),
    Step("3. Heads instead of a draft (Medusa)", "medusa", CODE, 64,
         "No second model: extra heads on the target guess ahead. Look at the tree: the green path is the branch the "
         "target agreed with."),
    Step("4. Guess a whole block (Jacobi, then CLLM)", "jacobi", LIST, 64,
         "The grid shows one block being fixed pass by pass. Plain Jacobi rarely fixes more than one token a pass, so "
         "it is slower than AR: then try cllm, a copy of the model trained to fix several at once (Method settings: "
         "decode by jacobi to see its grid; by lookahead, the default, it also tries phrases it has seen, and is "
         "faster)."),
    Step("5. Reuse phrases seen before (lookahead)", "lookahead", REUSE, 64,
         "No draft at all: the target's own earlier guesses, and phrases of the text so far, become the phrases it "
         "tries. It gains most where the answer repeats itself, as code repeats its names."),
    Step("6. Same method, another machine: a model too big for memory (speculative)", "speculative", CODE, 64,
         "Step 2 again, on the same model with its layers kept on disk, as a model too big for memory would be: every "
         "pass reads all the weights in again, however many tokens it checks. Each pass is slower, and that reading "
         "costs the same at any width, so checking the draft's guesses adds relatively less: the speedup against AR "
         "should be larger than in step 2. Compare the two. Why? On the Lesson tab, open \"What a pass costs on "
         "this machine\" and press Measure.", ON_DISK),
    Step("7. The race", "", CODE, 64,
         "Open the Race tab and press Race: every method is timed the same way, replayed side by side, and ends in a "
         "bar chart. Which wins, and is its bar clear of AR's range?"),
)

TITLES = [step.title for step in LESSON]

EXAMPLES = (  # the page's examples: the lesson's prompts first, those on which the methods' gains show
    CODE,
    LIST,
    REUSE,
    "Write a haiku about autumn leaves.",
    "Explain in two sentences why the sky is blue.",
    "Write a Python class for a bank account with deposit and withdraw methods.",
    "Translate to French: The library opens at nine in the morning.",
    "What is 17 times 23? Show your steps.",
    "Summarize: The Nile is the longest river in Africa. It flows north through eleven countries into the "
    "Mediterranean Sea.",
)
DOCS_PROMPTS = ("Why is the sky blue?", "Write a haiku about the sea.")  # the prompts the README and docs quote


def shown_prompts() -> tuple[str, ...]:
    """Every prompt the page or the docs show. Each must be new to the model: its answer barely
    overlaps the shipped datastores (tests/test_lesson_prompts.py), and every training plan leaves
    out near-copies of it (`training.real_prompts.bench_prompts`)."""
    return tuple(dict.fromkeys([*(step.prompt for step in LESSON), *EXAMPLES, *DOCS_PROMPTS]))


def step_named(title: str) -> Step:
    return next(step for step in LESSON if step.title == title)


def notice_html(step: Step) -> str:
    return f'<div class="specdemo-lesson"><b>{html.escape(step.title)}.</b> {html.escape(step.notice)}</div>'
