"""A second family of training prompts, more varied in form than `prompts.py`'s templates.

The first family asks the same few questions of a list of topics; its answers taught the
Medusa heads and the drafts well on held-out answers of that family and less well on the bench
prompts, which are longer and more specific (emails with a purpose, code to explain, word
problems of many shapes, questions about passages with names and numbers). These templates
cover the same seven categories in those shapes, from our own word lists; none is a bench
prompt (`selfdistill` drops any exact repeat). Passages for summaries and passage questions are
written by the target itself in a first stage, in several genres (`varied_passage_requests`).
"""

import random

PEOPLE = [
    "your cousin", "your teacher", "a coworker", "your landlord", "an old school friend", "the school principal",
    "a hotel manager", "your team at work", "a new client", "your grandmother",
]
PURPOSES = [
    "asking for advice on buying a first bicycle", "asking to move Thursday's meeting to Friday morning",
    "thanking them for their help with a move last weekend", "asking about a package that never arrived",
    "inviting them to a small birthday dinner on Saturday", "politely asking them to keep the music down after ten",
    "asking for a letter of recommendation for a summer job", "apologizing for a late reply and suggesting a call",
    "telling them about a change of address", "asking whether they could water the plants during a holiday",
]
PRODUCTS = [
    "a solar-powered phone charger", "a foldable bicycle helmet", "noise-cancelling headphones for children",
    "a ceramic teapot that keeps tea warm", "a waterproof hiking backpack with a rain cover", "a plant pot that waters itself",
    "a wooden puzzle for toddlers", "an electric kettle with temperature settings", "a reading lamp that clips onto a book",
    "a set of reusable beeswax food wraps",
]
CHARACTERS = [
    "a shy dragon", "an old fisherman", "a lost kitten", "a young astronaut", "a talking tree", "a clumsy wizard",
    "a brave mouse", "a retired detective", "a girl who collects stones", "a clockmaker's apprentice",
]
GOALS = [
    "learns to paint", "finds a map hidden in a library book", "makes a friend in a new town", "enters a cooking contest",
    "helps a village prepare for a flood", "builds a small boat", "discovers a garden behind a locked gate",
]
SPEAKERS = [
    ("a mayor", "the opening of a new park"), ("a teacher", "students on the last day of school"),
    ("a chess club's president", "new members"), ("a scientist", "visitors of a science fair"),
    ("a bride's sister", "guests at a wedding dinner"), ("a shop owner", "customers at a shop's tenth birthday"),
    ("a librarian", "children at the start of a summer reading club"),
]
WRITING = [
    "Draft a warm email to {person} {purpose}.", "Compose a short text message to {person} {purpose}.",
    "Write the text of an online shop page selling {product}.", "Write a customer review of {product}, with one thing to improve.",
    "Tell a {words}-word story in which {character} {goal}.",
    "Write the opening paragraph of a novel about {character} who {goal}.",
    "Write what {speaker} might say to {audience}, in under 200 words.",
    "Write a poem of three short stanzas about {character} who {goal}.",
]

PHENOMENA = [
    "ice float on water", "the moon seem to change shape", "bread rise in the oven", "the sea taste salty",
    "leaves change color in autumn", "metal feel colder than wood", "thunder come after lightning", "we yawn",
    "a compass point north", "milk turn sour", "a spoon look bent in a glass of water", "onions make people cry",
]
PAIRS = [
    ("a virus", "a bacterium"), ("speed", "velocity"), ("a lake", "a pond"), ("an alligator", "a crocodile"),
    ("mass", "weight"), ("a meteor", "a meteorite"), ("baking soda", "baking powder"), ("memory", "storage in a computer"),
    ("a simile", "a metaphor"), ("a frog", "a toad"), ("an island", "a peninsula"), ("a rabbit", "a hare"),
]
DEVICES = [
    "a refrigerator", "a microwave oven", "the gears of a bicycle", "a thermometer", "a solar cell", "an elevator",
    "a touch screen", "a camera", "a smoke detector", "a hot air balloon",
]
GROUPS = [
    "famous rivers", "musical instruments", "inventions of the last century", "animals that hibernate",
    "kinds of clouds", "ancient wonders of the world", "vegetables that grow underground", "sports played with a ball",
]
QA = [
    "Why does {phenomenon}?", "What makes {phenomenon}? Explain it simply.",
    "How do {a} and {b} differ? One example of each, please.", "How does {device} work?",
    "Pick three {group} and tell me something surprising about each.", "How would you explain to a child how {device} works?",
]

FUNCTION_TASKS = [
    ("count_vowels", "takes a string and returns how many vowels it has"),
    ("word_lengths", "maps every word of a sentence to its length"),
    ("flatten", "turns a list of lists into one flat list"),
    ("is_sorted", "tells whether a list of numbers is in ascending order"),
    ("chunk", "splits a list into pieces of a given size"),
    ("most_frequent_letter", "returns the letter that appears most often in a text, ignoring case"),
    ("running_total", "returns the running totals of a list of numbers"),
    ("celsius_table", "prints a table of Celsius and Fahrenheit temperatures from 0 to 100 in steps of 10"),
    ("initials", "takes a full name and returns its initials"),
    ("only_even", "keeps only the even numbers of a list"),
]
CODING = [
    "In Python, write {name}, a function that {task}.", "Implement {name} in JavaScript: it {task}.",
    "In Python, write {name}, a function that {task}. Add a short docstring and two tests.",
    "What output does this Python snippet produce? Walk through it line by line.\n\n{code}",
    "This Python code should {purpose}, but it has a bug. Find it and fix it:\n\n{buggy}",
]


def code_snippet(rng: random.Random) -> str:
    """A few lines of Python with random numbers, for 'explain what it prints'."""
    values = [rng.randint(1, 20) for _ in range(rng.randint(4, 6))]
    limit = rng.randint(3, 12)
    shapes = [
        f"values = {values}\ncount = 0\nfor v in values:\n    if v % 2 == 0:\n        count += 1\nprint(count)",
        f"numbers = {values}\nresult = [n * 2 for n in numbers if n > {limit}]\nprint(result)",
        f"word = \"{rng.choice(['banana', 'lighthouse', 'keyboard', 'umbrella'])}\"\nprint(word[1:4], len(word))",
        f"x = {limit}\nwhile x > 0:\n    print(x)\n    x -= {rng.randint(2, 4)}",
        f"totals = {{}}\nfor n in {values}:\n    totals[n % 3] = totals.get(n % 3, 0) + n\nprint(totals)",
    ]
    return rng.choice(shapes)


BUGGY = [
    ("return the product of a list of numbers", "def product(values):\n    result = 0\n    for v in values:\n        result *= v\n    return result"),
    ("return the average of a list", "def average(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / len(values) + 1"),
    ("count down from n to 1", "def countdown(n):\n    while n > 0:\n        print(n)\n    n -= 1"),
    ("reverse a string", "def reverse(text):\n    return text[1::-1]"),
]

MATH = [
    "A recipe needs {a} cups of flour for {b} cookies. How much flour is needed for {c} cookies? Show your steps.",
    "A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
    "Anna reads {a} pages a day. How many days does she need to finish a {c}-page book?",
    "What is the average of {a}, {b} and {c}? Explain how you got it.",
    "How many hours and minutes are {c} minutes?",
    "A museum visit costs {a} dollars per adult and {b} per child. What does a family of 2 adults and 3 children pay?",
    "Is {c} divisible by {b}? Explain why or why not.",
    "A tank holds {c} liters and fills at {a} liters a minute. How long does it take to fill it?",
    "A bike was {c} dollars and its price rose by {p}%. What does it cost now? Explain each step.",
    "Solve the equation {a}x - {b} = {c} and check your answer.",
]

FOREIGN = [
    ("French", "Nous allons au marché tous les samedis matin avec mes parents."),
    ("French", "Le train pour Marseille part à huit heures et quart, ne sois pas en retard."),
    ("French", "J'aime lire un bon livre le soir avant de dormir."),
    ("Spanish", "Mañana vamos a visitar a mis abuelos que viven en el campo."),
    ("Spanish", "¿Sabes dónde puedo comprar un billete de autobús para el centro?"),
    ("Spanish", "La biblioteca cierra a las seis, así que tenemos que darnos prisa."),
    ("German", "Im Sommer fahren wir jedes Jahr an die Ostsee."),
    ("German", "Kannst du mir bitte sagen, wann der nächste Bus kommt?"),
    ("German", "Meine Großmutter backt jeden Sonntag einen Apfelkuchen."),
    ("Italian", "Il ristorante all'angolo fa la pizza più buona della città."),
]
ENGLISH = [
    "The new bakery on the corner sells fresh bread every morning, and it is always busy by eight.",
    "Could you send me the photos from the trip? I would like to print a few for my parents.",
    "Our flight was delayed by two hours, so we missed the connection in the evening.",
    "Please remember to bring a warm jacket, because it gets cold in the mountains at night.",
    "The children planted tomatoes in the school garden and will pick them in September.",
    "I am sorry I could not come to your party; I had a fever all weekend.",
    "The concert in the park is free, but you should arrive early to find a seat.",
    "My neighbor lent me his ladder so that I could repair the roof before the storm.",
]
TRANSLATION = [
    "What does this {language} sentence mean in English? \"{sentence}\"",
    "Please put this into {target}: \"{english}\"",
    "Render this in {target}, keeping the tone friendly: \"{english}\"",
]
TARGETS = ["French", "Spanish", "German", "Italian", "Portuguese", "Dutch"]

PASSAGE_KINDS = [
    "a short news report of roughly 150 words on {subject}, with names, a date and numbers",
    "the minutes of a neighborhood association meeting of roughly 150 words on {subject}, with what was agreed",
    "a description of roughly 150 words of {subject} for a visitor's guide, with opening hours and prices",
    "a short encyclopedia entry of roughly 150 words on {subject}",
]
SUBJECTS = [
    "a new cable car up a mountain", "a school that started growing its own vegetables",
    "a bookshop that hosts chess evenings", "a swimming pool that reopened after repairs", "a rare butterfly found in a school garden",
    "a local bakery that won a prize", "a museum of old toys", "a town's first electric buses", "a music festival by a lake",
    "a hiking trail through a forest", "a town that closed its centre to cars on Sundays", "a smart door lock",
]
SUMMARIZE = [
    "Sum up this text in two sentences.\n\n{passage}",
    "What are the three most important points of this text? Answer with a bulleted list.\n\n{passage}",
    "Retell this text for a young child in a few simple sentences.\n\n{passage}",
    "Condense this text into one short paragraph that keeps every number:\n\n{passage}",
]
PASSAGE_QUESTIONS = [
    "Which names, dates and numbers appear in the text below, and what does each refer to? Rely on the text alone.\n\nText: {passage}",
    "If the text below mentions a price, what is it? If it mentions none, reply that the text does not say.\n\nText: {passage}",
    "Passage: {passage}\n\nQuestion: who is mentioned in the passage, and what did each of them do?",
    "Read the text and answer in one sentence: where and when does this take place?\n\nText: {passage}",
]


def varied_first_stage(seed: int) -> list[str]:
    """Writing, QA, coding, math and translation prompts, shuffled by `seed`."""
    rng = random.Random(seed)
    prompts = []
    for template in WRITING:
        for _ in range(40):
            speaker, audience = rng.choice(SPEAKERS)
            prompts.append(template.format(
                person=rng.choice(PEOPLE), purpose=rng.choice(PURPOSES), product=rng.choice(PRODUCTS),
                words=rng.choice([80, 100, 150, 200]), character=rng.choice(CHARACTERS), goal=rng.choice(GOALS),
                speaker=speaker, audience=audience,
            ))
    for template in QA:
        for _ in range(20):
            a, b = rng.choice(PAIRS)
            prompts.append(template.format(phenomenon=rng.choice(PHENOMENA), a=a, b=b, device=rng.choice(DEVICES), group=rng.choice(GROUPS)))
    for template in CODING:
        for _ in range(40):
            name, task = rng.choice(FUNCTION_TASKS)
            purpose, buggy = rng.choice(BUGGY)
            prompts.append(template.format(name=name, task=task, code=code_snippet(rng), purpose=purpose, buggy=buggy))
    for template in MATH:
        for _ in range(20):
            prompts.append(template.format(a=rng.randint(2, 15), b=rng.randint(2, 12), c=rng.randint(20, 360), p=rng.choice([5, 10, 12, 20, 25])))
    for template in TRANSLATION:
        for _ in range(30):
            language, sentence = rng.choice(FOREIGN)
            prompts.append(template.format(language=language, sentence=sentence, target=rng.choice(TARGETS), english=rng.choice(ENGLISH)))
    prompts = list(dict.fromkeys(prompts))  # the random draws repeat some prompts
    rng.shuffle(prompts)
    return prompts


def varied_passage_requests() -> list[str]:
    """Requests for passages in several genres; the answers become `varied_passage_prompts`' texts."""
    return [f"Write {kind.format(subject=subject)}." for subject in SUBJECTS for kind in PASSAGE_KINDS]


def varied_passage_prompts(passages: list[str], seed: int) -> list[str]:
    """Two summaries and two passage questions around each passage the target wrote."""
    rng = random.Random(seed)
    prompts = []
    for passage in passages:
        for template in rng.sample(SUMMARIZE, 2) + rng.sample(PASSAGE_QUESTIONS, 2):
            prompts.append(template.format(passage=passage.strip()))
    rng.shuffle(prompts)
    return prompts
