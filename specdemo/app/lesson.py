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


GLOSSARY = (
    "**Target**: the language model whose answer we want. **Pass**: one run of the target over the text so far; "
    "checking a few extra tokens in a pass costs about as much as producing one. **Draft** (or guess): tokens proposed "
    "cheaply, which the target checks in one pass, keeping those it would have written itself. **Speedup**: tokens per "
    "second against AR's on the same prompt, timed the same way."
)

# Prompts on which each method's gain shows, chosen by tokens per target pass with the embedded
# model, 64 tokens, bfloat16 (docs/lesson.md): the prime function gives speculative about 2.7 and
# Medusa 2.6; the week gives CLLM 2.5 (Jacobi 1.0); the repeated sentence gives lookahead 2.5
# (the prime function: 1.3).
CODE = "Write a Python function that checks whether a number is prime, with a docstring."
LIST = "List the days of the week, one per line."
REPEAT = "Repeat this sentence three times: The quick brown fox jumps over the lazy dog."

LESSON = (
    Step("1. One token a pass (AR)", "ar", CODE, 64,
         "Every token is grey: one target pass made each. Note the speed: the range beside the speedup (about 1.0x here, AR against "
         "itself) is how much the timing wobbles on its own."),
    Step("2. A draft guesses, the target checks (speculative)", "speculative", CODE, 64,
         "Green tokens were guessed by the small draft and accepted by the target; red ones were rejected. Tokens per pass is above 1: "
         "that is the whole trick. The answer is exactly AR's."),
    Step("3. Heads instead of a draft (Medusa)", "medusa", CODE, 64,
         "No second model: extra heads on the target guess ahead. Look at the tree: the green path is the branch the target agreed with."),
    Step("4. Guess a whole block (Jacobi, then CLLM)", "jacobi", LIST, 64,
         "The grid shows one block being fixed pass by pass. Plain Jacobi rarely fixes more than one token a pass, so it is slower than "
         "AR: then try cllm, a copy of the model trained to fix several at once (Method settings: decode by jacobi to see its grid; "
         "by lookahead, the default, it also tries phrases it has seen, and is faster)."),
    Step("5. Reuse phrases seen before (lookahead)", "lookahead", REPEAT, 64,
         "No draft at all: the target's own earlier guesses become the phrases it tries. It gains most on repetitive text."),
    Step("6. The race", "", CODE, 64,
         "Open the Race tab and press Race: every method is timed the same way, replayed side by side, and ends in a bar chart. "
         "Which wins, and is its bar clear of AR's range?"),
)

TITLES = [step.title for step in LESSON]


def step_named(title: str) -> Step:
    return next(step for step in LESSON if step.title == title)


def notice_html(step: Step) -> str:
    return f'<div class="specdemo-lesson"><b>{html.escape(step.title)}.</b> {html.escape(step.notice)}</div>'
