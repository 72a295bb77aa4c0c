"""Prompts the target writes itself: the Magpie method (Xu et al. 2024, arXiv 2406.08464) with topic, task and length
steering.

An aligned chat model, given its chat template only up to the opening of a user turn, writes a plausible user turn:
sampling it until the template's end-of-turn token yields an instruction nobody on the project wrote. The system
message before that turn steers what kind of request comes out (:func:`steer_message`): a task of one of
:data:`CATEGORIES` (the 14 kinds of request of issue 54's outside check: chat, writing, roleplay, reasoning, math,
coding, extraction, STEM, humanities, translation, summarisation, QA, math word problems, retrieval-augmented
answering), a topic, and a length. The steering phrases are written here; the requests are the target's. A small
target follows the steering loosely (SmolLM2-135M-Instruct often writes a request of another kind), so a prompt's
``category`` is the category it was *steered* to.

Long-input tasks (``extraction``, ``summarisation``, ``rag``): the system message shows the target a passage
(:mod:`specgym.training.models.passages`) and says what the user will ask about it; the target writes the request
and the prompt is the request with the passage (:func:`compose`). Writing the passage into the user turn first and
letting the target continue gives a continuation of the passage, not a request, with a model this small.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specgym.errors import SpecgymError

#: category -> request kinds (``The user <task>.``); ``{name}`` is filled from :data:`FILLERS`.
CATEGORIES: dict[str, tuple[str, ...]] = {
    "chat": ("chats with you about their day and asks for your advice", "asks for a recommendation about {topic}",
             "asks your opinion on {topic}", "asks for tips to get better at {hobby}",
             "tells you about a small problem with {topic} and asks what to do"),
    "writing": ("asks you to write a short poem about {topic}", "asks you to write a friendly email about {topic}",
                "asks for a short story about {topic}", "asks for the opening paragraph of a blog post on {topic}",
                "asks you to write a product description for something related to {topic}",
                "asks you to rewrite a sentence they give so that it sounds more formal"),
    "roleplay": ("asks you to act as {role} and stay in character", "asks you to pretend to be {role} and answer "
                 "their question about {topic}", "starts a role-play in which you are {role}"),
    "reasoning": ("gives a logic puzzle and asks you to solve it", "asks a riddle", "asks which of two options is "
                  "better and wants careful reasoning", "asks a question that needs step-by-step reasoning about "
                  "{topic}", "asks what would happen if a familiar rule of everyday life changed"),
    "math": ("asks you to solve an equation", "asks how to compute a derivative or an integral",
             "asks a probability question", "asks you to simplify an algebraic expression", "asks a geometry "
             "question about a shape", "asks what a mathematical term means"),
    "coding": ("asks you to write a {language} function", "asks you to explain a short piece of {language} code",
               "asks you to find the bug in their {language} code", "asks how to do a common task in {language}",
               "asks for an SQL query", "asks about the difference between two programming concepts"),
    "extraction": ("asks you to extract the key facts from it as a list", "asks you to list every name, number or "
                   "date it mentions", "asks for its main points in JSON", "asks you to pull out the steps it "
                   "describes"),
    "stem": ("asks a question about {stem}", "asks you to explain a concept from {stem} simply", "asks how something "
             "in {stem} works"),
    "humanities": ("asks a question about {humanities}", "asks you to explain an idea from {humanities}",
                   "asks you to compare two people or events from {humanities}"),
    "translation": ("asks you to translate a sentence they give from English into {lang}", "asks you to translate a "
                    "short phrase they give from {lang} into English", "asks how to say an everyday sentence in "
                    "{lang}"),
    "summarisation": ("asks you to summarise it in a few sentences", "asks for a one-sentence summary of it",
                      "asks for a summary of it as bullet points", "asks for a title and a short summary of it"),
    "qa": ("asks a factual question about {topic}", "asks a general-knowledge question", "asks what a word means",
           "asks how an everyday object works", "asks why something in nature happens"),
    "math_word": ("asks a math word problem about {scenario} and wants a step-by-step answer", "asks a word problem "
                  "about {scenario} that needs two or three calculations"),
    "rag": ("asks a question that the text answers", "asks what the text says about one detail in it",
            "asks a question and wants the answer based only on the text"),
}
#: The long-input categories: their prompts quote a passage.
PASSAGE_CATEGORIES = ("extraction", "summarisation", "rag")
#: Placeholder -> values (steering vocabulary).
FILLERS: dict[str, tuple[str, ...]] = {
    "topic": ("cooking", "travel", "gardening", "personal finance", "fitness", "pets", "music", "films", "books",
              "history", "space", "the ocean", "climate", "cities", "friendship", "work", "school", "sports",
              "technology", "health", "art", "photography", "languages", "cars", "weather", "holidays", "food",
              "architecture", "games", "science", "coffee", "mountains", "trains", "birds", "the internet",
              "volunteering", "moving house", "a job interview", "a birthday party", "sleep"),
    "hobby": ("chess", "drawing", "running", "baking", "guitar", "photography", "writing", "swimming", "knitting"),
    "role": ("a pirate", "a tour guide", "a detective", "a chef", "a medieval knight", "a job interviewer",
             "a customer support agent", "a famous scientist", "a teacher", "a travel agent", "a fitness coach"),
    "language": ("Python", "JavaScript", "Java", "C", "C++", "Rust", "Go", "Bash"),
    "stem": ("physics", "chemistry", "biology", "astronomy", "computer science", "engineering", "medicine",
             "geology", "statistics", "ecology", "electronics"),
    "humanities": ("history", "philosophy", "literature", "art history", "music theory", "economics", "law",
                   "psychology", "sociology", "religion", "linguistics", "political science"),
    "lang": ("French", "German", "Spanish", "Italian", "Portuguese", "Dutch", "Chinese", "Japanese"),
    "scenario": ("shopping", "travel time and speed", "a recipe", "ages of family members", "saving money",
                 "workers and hours", "a school trip", "sharing pizza", "a garden", "train tickets", "interest on a "
                 "loan", "painting a room"),
}
#: How long the user's message is (non-passage categories).
LENGTHS = ("The user's message is short: one sentence.", "The user's message is two or three sentences long and "
           "gives some context.", "The user's message is detailed and explains what they need.")
SYSTEM_HEAD = "You are a helpful AI assistant."
_MARK = "\x00specgym-user-turn\x00"


@dataclass
class Seed:
    """One user turn to sample: what steers it.

    Attributes:
        id: The prompt id it becomes (``m000123``: its index in the plan).
        category: One of :data:`CATEGORIES`.
        task: The request kind, placeholders filled.
        length: The length steer (empty for passage categories).
        passage: The passage id the request is about (passage categories), else None.
    """

    id: str
    category: str
    task: str
    length: str = ""
    passage: str | None = None

    def steer(self) -> str:
        """The system message without any passage (what an echo filter compares with)."""
        return f"{SYSTEM_HEAD} The user {self.task}. {self.length}".strip()


def check_categories(names: Sequence[str]) -> tuple[str, ...]:
    """The categories named (``all`` for every one), checked; in :data:`CATEGORIES` order."""
    chosen = set(CATEGORIES) if list(names) == ["all"] else set(names)
    bad = sorted(chosen - set(CATEGORIES))
    if bad or not chosen:
        raise SpecgymError(f"--categories {','.join(names)}: unknown category {', '.join(bad) or '(none)'}; choose "
                           f"from {','.join(CATEGORIES)} or all")
    return tuple(c for c in CATEGORIES if c in chosen)


def _fill(template: str, rng: np.random.Generator) -> str:
    out = template
    for name, values in FILLERS.items():
        while "{" + name + "}" in out:
            out = out.replace("{" + name + "}", values[int(rng.integers(len(values)))], 1)
    return out


def plan_seeds(n: int, categories: Sequence[str], seed: int = 0) -> list[Seed]:
    """``n`` seeds, categories in turn; seed ``i``'s choices come from its own generator ``(seed, i)``, so a longer
    plan starts with the same seeds as a shorter one. Passage ids are assigned later (:func:`assign_passages`)."""
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        cat = categories[i % len(categories)]
        tasks = CATEGORIES[cat]
        task = _fill(tasks[int(rng.integers(len(tasks)))], rng)
        length = "" if cat in PASSAGE_CATEGORIES else LENGTHS[int(rng.integers(len(LENGTHS)))]
        out.append(Seed(f"m{i:06d}", cat, task, length))
    return out


def assign_passages(seeds: list[Seed], pool: Sequence[str], per_passage: int) -> None:
    """Give the passage seeds, in order, the passages of ``pool``: ``per_passage`` consecutive ones each."""
    j = 0
    for s in seeds:
        if s.category in PASSAGE_CATEGORIES:
            if j // per_passage >= len(pool):
                raise SpecgymError(f"{len(pool)} passages are too few for the plan's passage prompts "
                                   f"({per_passage} per passage); ask for fewer prompts or more passages per prompt")
            s.passage = pool[j // per_passage]
            j += 1


def passage_seeds_needed(seeds: Sequence[Seed] | int, categories: Sequence[str], per_passage: int) -> int:
    """Passages a plan of ``seeds`` (or of that many seeds) needs."""
    n = seeds if isinstance(seeds, int) else len(seeds)
    k = sum(1 for i in range(n) if categories[i % len(categories)] in PASSAGE_CATEGORIES)
    return -(-k // per_passage)


def system_message(seed: Seed, passage_text: str | None) -> str:
    """The steering system message of a seed: the task and length, or, with a passage, the passage and the task."""
    if seed.passage is None or passage_text is None:
        return seed.steer()
    return f"{SYSTEM_HEAD} The user has this text:\n\n{passage_text}\n\nThe user {seed.task}."


def pre_query(tokenizer: Any, system: str) -> str:
    """The chat template rendered up to the opening of the user turn (Magpie's pre-query template), as text."""
    if not getattr(tokenizer, "chat_template", None):
        raise SpecgymError("--target: its tokenizer has no chat template; Magpie needs an aligned chat model")
    try:
        text = tokenizer.apply_chat_template([{"role": "system", "content": system},
                                              {"role": "user", "content": _MARK}], tokenize=False)
    except Exception as exc:  # noqa: BLE001 - a template that rejects a system turn raises its own exception type
        raise SpecgymError(f"--target: its chat template cannot render a system message ({exc})") from None
    if not isinstance(text, str) or _MARK not in text:
        raise SpecgymError("--target: its chat template drops the user's text; cannot find where a user turn opens")
    return text.split(_MARK)[0]


def end_of_turn_ids(tokenizer: Any) -> list[int]:
    """The tokens that end a user turn: the first token the template writes after the user's text (``<|im_end|>``
    in ChatML) and the tokenizer's EOS."""
    text = tokenizer.apply_chat_template([{"role": "system", "content": "s"}, {"role": "user", "content": _MARK}],
                                         tokenize=False)
    after = text.split(_MARK, 1)[1]
    ids = [int(t) for t in tokenizer(after, add_special_tokens=False)["input_ids"]][:1] if after else []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    if not ids:
        raise SpecgymError("--target: neither its chat template nor its tokenizer names an end-of-turn token")
    return sorted(set(ids))


def compose(seed: Seed, request: str, passage_text: str | None) -> str:
    """The prompt a seed's request becomes: the request itself, or with its passage (retrieval-augmented answering:
    the passage as context, then the question; extraction and summarisation: the request, then the text)."""
    request = request.strip()
    if seed.passage is None or passage_text is None:
        return request
    if seed.category == "rag":
        return f"Context:\n{passage_text}\n\nQuestion: {request}"
    return f"{request}\n\nText:\n{passage_text}"
