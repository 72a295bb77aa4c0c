"""The real pair's prompts file: instruction-style requests in eight categories, written for this project.

``specgym`` ships ``data/workloads/smollm2-prompts.jsonl`` built by :func:`build_prompts` (``make prompts-smollm2``):
requests a chat model's users send (code, chat, writing, math, summarisation of a given passage, translation,
extraction, question answering over a given passage), each with a fixed ``split`` drawn by prompt (stratified by
category, seeded), so that every recording of the pair (greedy, T = 0.7) and the drafter trained for it agree on
which prompts are held out. The passages are short texts written for this file; nothing is taken from a dataset.
The chat template is applied when the prompts are recorded or served (:func:`~specgym.envs.engines.live.model_loading.
encode_prompt`), not stored here.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from specgym.io import atomic_write_text

#: The eight categories, in file order.
CATEGORIES = ("code", "chat", "writing", "math", "summarisation", "translation", "extraction", "qa")
#: Share of each category's prompts in train / val / test.
SPLIT_FRACTIONS = (0.7, 0.15, 0.15)
SEED = 2026

_CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "counts the vowels in a sentence", "merges two sorted lists into one sorted list",
    "removes duplicates from a list while keeping the order", "computes the factorial of n iteratively",
    "finds the largest element of a list without using max()", "converts Celsius to Fahrenheit",
    "checks whether a string is a palindrome", "flattens a nested list of lists", "counts word frequencies in a text",
    "returns the greatest common divisor of two integers", "validates that a string is a valid IPv4 address",
    "computes the average of a list of numbers, returning None for an empty list", "transposes a matrix given as a list of rows",
    "reads a CSV file and returns its rows as dictionaries", "implements binary search on a sorted list",
    "groups a list of words by their first letter", "returns the second largest number in a list",
    "capitalises the first letter of every word in a sentence", "checks whether two strings are anagrams",
    "sums the digits of an integer", "rotates a list to the right by k positions",
    "returns all the prime numbers below n using a sieve", "converts a Roman numeral to an integer",
    "computes the running total of a list", "splits a list into chunks of size n",
    "finds the longest word in a sentence", "converts a number of seconds to hours, minutes and seconds",
    "removes all punctuation from a string", "checks whether a year is a leap year",
    "returns the intersection of two lists", "counts the lines in a text file",
    "implements a simple stack class with push, pop and peek", "computes the dot product of two vectors",
    "finds the index of the first repeated character in a string", "generates the multiplication table of a number",
    "converts a list of key-value pairs to a dictionary", "checks whether parentheses in a string are balanced",
]
_CODE_FORMS = ["Write a Python function that {t}.", "Write a short Python function that {t}, with a docstring.",
               "Show me Python code that {t}, and explain it briefly.", "In Python, how do I write a function that {t}?"]

_CHAT = [
    "Hi! How are you today?", "What is a good way to start learning to cook?", "Can you recommend a hobby for a rainy day?",
    "I feel tired after lunch every day. Any tips?", "What should I pack for a weekend trip to the mountains?",
    "How can I get better at remembering names?", "What are some fun things to do with friends on a Saturday?",
    "Do you have any advice for someone starting their first job?", "How do I keep a houseplant alive?",
    "What is your favourite season and why?", "Can you suggest a simple breakfast that is healthy?",
    "How do I stay focused while studying?", "What is a good gift for a friend who likes reading?",
    "I want to start running. How should I begin?", "How can I make my mornings less stressful?",
    "What are some good habits for better sleep?", "Can you tell me a fun fact about space?",
    "How do I politely say no to extra work?", "What is a nice way to spend a quiet evening at home?",
    "How can I save a little money every month?", "What should I think about before adopting a dog?",
    "Can you suggest a name for a small bakery?", "How do I make new friends in a new city?",
    "What are some easy ways to drink more water?", "What can I cook with rice, eggs and spinach?",
    "How do I write a good thank-you note?", "What is the best way to learn a new language?",
    "Can you help me plan a short birthday party for my sister?", "How do I deal with a noisy neighbour?",
    "What are some tips for a long car journey with kids?", "How can I be more patient?",
    "What board game would you suggest for four players?", "Why do people like watching sunsets?",
    "What is a good way to organise my desk?", "How do I prepare for a job interview?",
    "Can you tell me a short joke?", "How can I reduce the time I spend on my phone?",
    "What should I do on my first day in a new school?", "How do I choose a good book to read?",
    "What is a simple way to start journaling?",
]

_WRITING_TOPICS = [
    "a lighthouse keeper who finds a message in a bottle", "a robot learning to paint", "the first day of spring",
    "a cat who thinks it is a king", "a small town during a snowstorm", "a friendship between a fox and a crow",
    "the sound of rain on a tin roof", "a child's first visit to the sea", "an old library at night",
    "a baker who wakes up before dawn", "a lost umbrella travelling around the city", "the last leaf on a tree",
    "a train journey through the mountains", "a garden that grows in the desert", "a musician playing in the park",
    "a dragon who is afraid of the dark", "a letter to one's future self", "the smell of fresh bread",
]
_WRITING_FORMS = ["Write a short poem about {t}.", "Write a short story (about 100 words) about {t}.",
                  "Write a haiku about {t}.", "Write the opening paragraph of a novel about {t}."]
_WRITING_OTHER = [
    "Write a short email to my manager asking for Friday off.", "Write a product description for a reusable water bottle.",
    "Write a two-sentence horror story.", "Write a short speech for a friend's wedding.",
    "Write a polite complaint about a late delivery.", "Write a motivational message for a team before a big deadline.",
    "Write a short review of a cosy cafe.", "Write an invitation to a neighbourhood picnic.",
]

_MATH = [
    "What is 17 times 23?", "A shirt costs $25 and is on sale for 20% off. What is the sale price?",
    "Solve for x: 3x + 7 = 22.", "What is the area of a circle with radius 4? Use pi = 3.14.",
    "If a train travels 180 km in 2 hours, what is its average speed?", "What is 15% of 240?",
    "Simplify the fraction 36/48.", "What is the sum of the first 10 positive integers?",
    "A rectangle has a length of 12 cm and a width of 5 cm. What is its perimeter?",
    "Tom has 3 times as many apples as Sara. Together they have 24 apples. How many does Sara have?",
    "What is the square root of 144?", "Convert 0.75 to a fraction.", "What is 2 to the power of 10?",
    "If 5 pencils cost $2, how much do 12 pencils cost?", "What is the least common multiple of 6 and 8?",
    "A recipe needs 2 cups of flour for 12 cookies. How much flour is needed for 30 cookies?",
    "What is the average of 4, 8, 15, 16 and 23?", "Solve: 2(x - 3) = 10.",
    "How many minutes are there in 3.5 hours?", "What is 1000 divided by 8?",
    "A car uses 6 litres of fuel per 100 km. How much fuel does it need for 250 km?",
    "What is the next number in the sequence 2, 6, 12, 20, 30?", "What is 7/8 as a percentage?",
    "The angles of a triangle are 50 and 60 degrees. What is the third angle?",
    "If I save $15 a week, how many weeks until I have $300?", "What is 45 + 78 - 29?",
    "A box holds 24 eggs. How many boxes are needed for 150 eggs?", "What is the volume of a cube with side 5 cm?",
    "Is 91 a prime number? Explain.", "What is 3/4 plus 2/3?",
    "A store sells 3 notebooks for $4.50. What is the price of one notebook?", "What is 12 squared minus 5 squared?",
    "How many seconds are there in a day?", "A bike costs $360 after a 10% discount. What was the original price?",
    "Solve for y: y/4 + 3 = 9.", "What is the median of 3, 9, 1, 7, 5?",
    "If a pizza is cut into 8 slices and I eat 3, what fraction is left?", "What is 6% of 50?",
    "A square has an area of 81 square metres. What is its side length?", "Round 3.14159 to two decimal places.",
]

#: Passages written for this file (summarisation, extraction and question answering read them).
_PASSAGES = [
    ("The town of Alder Creek held its first farmers' market in May 2019. Twelve stalls sold vegetables, honey and "
     "bread. By 2023 the market had grown to forty stalls and moved from the school car park to the main square. "
     "It now opens every Saturday from 8 am to 1 pm, and the council estimates that about 2,000 people visit each week."),
    ("Maria Lopez started her bicycle repair shop in 2015 with one workbench and a loan of 5,000 euros. She hired her "
     "first employee, a student named Jonas, two years later. The shop now repairs around 60 bicycles a week and "
     "also offers free repair classes on the first Sunday of every month."),
    ("The Blue Ridge hiking trail is 14 kilometres long and climbs 600 metres. Most walkers finish it in five to six "
     "hours. The trail is closed from December to February because of ice. Dogs are allowed if they are kept on a "
     "lead, and there is a small shelter with drinking water at the halfway point."),
    ("Our company's new expense policy starts on 1 March. Employees must submit receipts within 30 days of a purchase. "
     "Meals during travel are covered up to 40 dollars a day. Taxi rides are covered only after 10 pm or when no "
     "public transport is available. Questions should be sent to the finance team at finance@example.com."),
    ("Honeybees communicate the location of food with a movement called the waggle dance. A bee that has found "
     "flowers returns to the hive and walks in a figure-eight pattern. The angle of the dance shows the direction of "
     "the food relative to the sun, and the length of the waggle shows how far away it is."),
    ("The Riverside Library will close for renovation from 3 June to 15 August. During this time, books can be "
     "returned at the Oak Street branch, which will extend its opening hours until 8 pm on weekdays. The renovated "
     "library will have a new children's room, twenty more computers and a cafe."),
    ("Sam ordered a laptop on 2 October and paid 899 dollars. The laptop arrived on 9 October with a cracked screen. "
     "Sam contacted customer service the same day and was told a replacement would be sent within five working "
     "days. The replacement arrived on 14 October and works well."),
    ("Photosynthesis is the process plants use to turn light into chemical energy. Inside the leaves, chlorophyll "
     "absorbs sunlight. The plant takes in carbon dioxide from the air and water from the soil, and produces glucose "
     "and oxygen. The oxygen is released into the air, which is why forests are important for the atmosphere."),
    ("The annual Green Valley running race takes place on 21 September. There are two distances: 5 km and 10 km. "
     "Registration costs 15 dollars for the 5 km race and 25 dollars for the 10 km race. All runners receive a "
     "t-shirt, and the first 100 to register also get a water bottle. The race starts at 9 am at City Park."),
    ("In 1928 Alexander Fleming noticed that mould had killed bacteria in one of his dishes. The mould produced a "
     "substance he called penicillin. It took more than ten years before other scientists found a way to produce it "
     "in large amounts. Penicillin became widely used during the 1940s and saved many lives."),
]
_SUMMARY_FORMS = ["Summarise the following text in one sentence.\n\n{p}", "Give a short summary of this passage.\n\n{p}",
                  "Summarise the main points of this text as a bulleted list.\n\n{p}",
                  "Read the text below and write a two-sentence summary.\n\n{p}"]
_EXTRACTION = [
    (0, "List every number that appears in the text."), (0, "Extract the year the market started and its opening hours."),
    (1, "Extract the names of all the people mentioned."), (1, "Return the founding year and the loan amount as JSON."),
    (2, "Extract the length, the climb and the closed months of the trail."), (2, "List the rules for dogs and the facilities on the trail."),
    (3, "Extract the daily meal limit and the deadline for receipts."), (3, "Find the email address in the text."),
    (4, "List the two things the waggle dance communicates."), (4, "Extract the name of the movement and its shape."),
    (5, "Extract the closing dates and the address of the other branch."), (5, "List the new features of the library as JSON."),
    (6, "Extract all dates and what happened on each."), (6, "Extract the price of the laptop and the problem it had."),
    (7, "List the inputs and outputs of photosynthesis."), (7, "Extract the name of the pigment that absorbs sunlight."),
    (8, "Extract the race distances and their prices as a table."), (8, "Extract the date, time and place of the race."),
    (9, "Extract the year of the discovery and the name of the scientist."), (9, "List the decades mentioned in the text."),
]
_QA = [
    (0, "How many stalls did the market have in 2023?"), (0, "Where was the market held before it moved?"),
    (0, "On which day of the week does the market open?"), (0, "About how many people visit the market each week?"),
    (1, "When did Maria hire her first employee?"), (1, "How many bicycles does the shop repair each week?"),
    (1, "When are the free repair classes held?"), (1, "How much money did Maria borrow?"),
    (2, "How long does it take most walkers to finish the trail?"), (2, "Why is the trail closed in winter?"),
    (2, "Is there drinking water on the trail?"), (2, "How high does the trail climb?"),
    (3, "When does the new expense policy start?"), (3, "When are taxi rides covered?"),
    (4, "What does the angle of the waggle dance show?"), (4, "What shape does the bee walk in?"),
    (5, "How long will the library be closed?"), (5, "How many new computers will the library have?"),
    (6, "How many days after ordering did the first laptop arrive?"), (6, "When did the replacement arrive?"),
    (7, "What does chlorophyll do?"), (7, "Why are forests important for the atmosphere?"),
    (8, "How much does the 10 km race cost?"), (8, "Who gets a water bottle?"),
    (9, "What did Fleming notice in 1928?"), (9, "When did penicillin become widely used?"),
    (9, "Why did it take years before penicillin was used widely?"), (3, "Who should questions about the policy go to?"),
    (5, "Where can books be returned during the renovation?"), (8, "What time does the race start?"),
]
_QA_FORM = "Answer the question using only the text below.\n\nText: {p}\n\nQuestion: {q}"
_EXTRACTION_FORM = "{q}\n\nText: {p}"

_TRANSLATION_SENTENCES = [
    "Good morning, how are you?", "Where is the train station?", "I would like a cup of coffee, please.",
    "The weather is beautiful today.", "My brother lives in a big city.", "Can you help me find my keys?",
    "We are going to the beach tomorrow.", "This book is very interesting.", "What time does the shop open?",
    "I am learning to play the guitar.", "The children are playing in the garden.", "Thank you for your help.",
    "How much does this cost?", "I have two cats and a dog.", "The museum is closed on Mondays.",
    "Please speak more slowly.", "Our flight leaves at seven o'clock.", "She likes to read before she sleeps.",
    "The soup is too hot.", "We need to buy bread and milk.",
]
_LANGUAGES = ["French", "Spanish", "German", "Italian"]


def _items() -> list[tuple[str, str]]:
    """(category, prompt) pairs in file order."""
    items: list[tuple[str, str]] = []
    items += [("code", _CODE_FORMS[i % len(_CODE_FORMS)].format(t=t)) for i, t in enumerate(_CODE_TASKS)]
    items += [("chat", t) for t in _CHAT]
    writing = [_WRITING_FORMS[i % len(_WRITING_FORMS)].format(t=t) for i, t in enumerate(_WRITING_TOPICS)]
    items += [("writing", t) for t in writing + _WRITING_OTHER]
    items += [("math", t) for t in _MATH]
    items += [("summarisation", _SUMMARY_FORMS[(2 * i + j) % len(_SUMMARY_FORMS)].format(p=p))
              for i, p in enumerate(_PASSAGES) for j in range(2)]
    items += [("translation", f"Translate into {_LANGUAGES[i % len(_LANGUAGES)]}: {s}")
              for i, s in enumerate(_TRANSLATION_SENTENCES)]
    items += [("translation", f"Translate into English: {s}") for s in _FOREIGN]
    items += [("extraction", _EXTRACTION_FORM.format(q=q, p=_PASSAGES[i])) for i, q in _EXTRACTION]
    items += [("qa", _QA_FORM.format(p=_PASSAGES[i], q=q)) for i, q in _QA]
    return items


_FOREIGN = [
    "Je voudrais réserver une table pour deux personnes.", "¿Dónde está la biblioteca?",
    "Ich habe heute keine Zeit.", "La casa è molto grande.", "Nous avons visité le musée hier.",
    "Me gusta mucho la música clásica.", "Das Wetter ist heute schön.", "Il treno parte alle otto.",
    "Elle mange une pomme.", "El perro duerme en el jardín.",
]


def build_prompts(max_new_tokens: int = 128) -> list[dict]:
    """The prompts file's records: ``id``, ``category``, ``split``, ``prompt``, ``max_new_tokens``.

    Splits are drawn per category from a seeded permutation (``SPLIT_FRACTIONS``), so each category is present in
    train, val and test.
    """
    items = _items()
    rng = np.random.default_rng(SEED)
    out = []
    for cat in CATEGORIES:
        prompts = [p for c, p in items if c == cat]
        n = len(prompts)
        n_val = max(1, round(n * SPLIT_FRACTIONS[1]))
        n_test = max(1, round(n * SPLIT_FRACTIONS[2]))
        split = np.full(n, "train", dtype=object)
        perm = rng.permutation(n)
        split[perm[:n_val]] = "val"
        split[perm[n_val : n_val + n_test]] = "test"
        out += [{"id": f"sm-{cat}-{i:03d}", "category": cat, "split": str(split[i]), "prompt": p,
                 "max_new_tokens": max_new_tokens} for i, p in enumerate(prompts)]
    return out


def write_prompts(out: str | Path, max_new_tokens: int = 128) -> int:
    """Write the prompts file (atomically); returns the number of prompts."""
    rows = build_prompts(max_new_tokens)
    atomic_write_text(Path(out), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return len(rows)


if __name__ == "__main__":  # ``make prompts-smollm2``
    import sys

    target = sys.argv[1] if len(sys.argv) > 1 else "data/workloads/smollm2-prompts.jsonl"
    print(f"wrote {target}: {write_prompts(target)} prompts")
