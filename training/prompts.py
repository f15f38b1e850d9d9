"""The prompts we write for self-distillation: templates x topics over the bench's categories.

None of them is a benchmark prompt (ours in specdemo/prompts.jsonl, or Spec-Bench's) or a
prompt the page shows: they are built here from our own word lists, and `without_bench_prompts`
drops any near-copy of those to be sure. Summarization and question-answering prompts are built in a second
stage around passages the target itself wrote (`passage_prompts`).
"""

import random

TOPICS = [
    "volcanoes", "honeybees", "the moon", "bicycles", "rainforests", "chess", "coffee", "the ocean tides",
    "electric cars", "ancient Egypt", "recycling", "the human heart", "solar panels", "penguins", "jazz music",
    "the printing press", "earthquakes", "vaccines", "public libraries", "deserts", "coral reefs", "trains",
    "the internet", "dinosaurs", "gardening", "clouds", "mountains", "the Roman Empire", "bread baking",
    "wind turbines", "friendship", "sleep", "photosynthesis", "the Olympic Games", "lighthouses", "owls",
    "glaciers", "paper money", "video games", "rivers", "bridges", "kites", "tea", "football", "robots",
    "the stars", "snow", "the immune system", "maps", "museums",
]
CONCEPTS = [
    "gravity", "inflation", "a black hole", "machine learning", "evolution", "democracy", "compound interest",
    "the water cycle", "a computer virus", "supply and demand", "electricity", "DNA", "a rainbow", "an atom",
    "climate change", "a vaccine", "the stock market", "a recursive function", "a database", "friction",
]
WRITING = [
    "Write a short poem about {topic}.", "Write a four-line rhyme about {topic}.",
    "Write a short story for children about {topic}.", "Write a blog post introduction about {topic}.",
    "Write a tweet announcing a new event about {topic}.", "Write a limerick about {topic}.",
    "Write a short speech for a school assembly about {topic}.", "Describe {topic} to someone who has never seen it.",
    "Write a diary entry of a person who loves {topic}.", "Write an advertisement for a museum exhibit on {topic}.",
]
QA = [
    "What are three interesting facts about {topic}?", "Why are {topic} important?",
    "Give me a short history of {topic}.", "What would a beginner need to know about {topic}?",
    "List five questions a student might ask about {topic}.", "What are the pros and cons of {topic}?",
]
EXPLAIN = [
    "Explain {concept} in simple terms.", "Explain {concept} to a ten-year-old.",
    "What is {concept}? Give an example.", "How would you teach {concept} in one paragraph?",
]
CODING_TASKS = [
    "reverses a list", "counts the vowels in a string", "checks whether a number is prime", "computes a factorial",
    "returns the Fibonacci numbers below a limit", "removes duplicates from a list", "finds the second largest number",
    "converts Celsius to Fahrenheit", "merges two sorted lists", "counts words in a text file",
    "checks whether two words are anagrams", "sums the digits of an integer", "capitalizes every word of a sentence",
    "finds the most common element of a list", "validates an email address roughly",
]
CODING = [
    "Write a Python function that {task}.", "Write a JavaScript function that {task}.",
    "Write a Python function that {task}, with a docstring and one example.", "Explain how to write code that {task}.",
]
MATH = [
    "What is {a} times {b}? Show your work.", "What is {a} plus {b} minus {c}?",
    "A box holds {a} apples. How many apples are in {b} boxes?", "Solve for x: {a}x + {b} = {c}.",
    "What is {p}% of {c}? Explain.", "A car drives {c} km in {a} hours. What is its average speed?",
    "If a shirt costs {c} dollars and is {p}% off, what is the new price?",
    "Tom has {c} marbles and gives {a} to each of {b} friends. How many are left?",
]
SENTENCES = [
    "The weather is beautiful today.", "I would like a cup of coffee, please.", "Where is the train station?",
    "My brother plays the guitar every evening.", "We are going to the beach tomorrow.",
    "The children are reading books in the garden.", "This restaurant serves the best soup in town.",
    "Can you help me find my keys?", "The meeting starts at ten o'clock.", "She has lived in this city for five years.",
    "Please close the window, it is cold.", "The museum is closed on Mondays.", "I forgot my umbrella at home.",
    "Our teacher gave us a lot of homework.", "The cat is sleeping on the sofa.",
]
LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese"]
TRANSLATION = ["Translate into {language}: {sentence}", "How do you say this in {language}? {sentence}"]
PASSAGE_REQUEST = "Write an informative paragraph of about 120 words about {topic}."
SUMMARIZE = [
    "Summarize the following text in one sentence:\n\n{passage}",
    "Summarize the main points of this text as three bullet points:\n\n{passage}",
    "Give a short title and a two-sentence summary of this text:\n\n{passage}",
]
RAG = [
    "Using only the passage below, answer: what is the passage mainly about?\n\nPassage: {passage}",
    "Read the passage and list two facts it states.\n\nPassage: {passage}",
    "Based only on this text, what is one thing a reader learns about {topic}?\n\nText: {passage}",
]


def first_stage_prompts(seed: int) -> list[str]:
    """Writing, QA, explanation, coding, math and translation prompts, shuffled by `seed`."""
    rng = random.Random(seed)
    prompts = [t.format(topic=topic) for t in WRITING + QA for topic in TOPICS]
    prompts += [t.format(concept=concept) for t in EXPLAIN for concept in CONCEPTS]
    prompts += [t.format(task=task) for t in CODING for task in CODING_TASKS]
    for template in MATH:
        for _ in range(12):
            a, b, p = rng.randint(2, 19), rng.randint(2, 12), rng.choice([10, 15, 20, 25, 30, 40, 50])
            prompts.append(template.format(a=a, b=b, c=rng.randint(20, 400), p=p))
    prompts += [t.format(language=lang, sentence=s) for t in TRANSLATION for lang in LANGUAGES for s in SENTENCES]
    rng.shuffle(prompts)
    return prompts


def passage_requests() -> list[str]:
    return [PASSAGE_REQUEST.format(topic=topic) for topic in TOPICS]


def passage_prompts(passages: dict[str, str], seed: int) -> list[str]:
    """Summarization and RAG prompts around passages the target wrote, keyed by topic."""
    rng = random.Random(seed)
    prompts = []
    for topic, passage in passages.items():
        for template in rng.sample(SUMMARIZE, 2) + rng.sample(RAG, 2):
            prompts.append(template.format(topic=topic, passage=passage.strip()))
    rng.shuffle(prompts)
    return prompts


def without_bench_prompts(prompts: list[str], held_out: list[str]) -> list[str]:
    """`prompts` less every one that near-copies a held-out prompt (`real_prompts.HeldOut`)."""
    from .real_prompts import HeldOut

    held = HeldOut(held_out)
    return [prompt for prompt in prompts if not held.copied_by(prompt)]
