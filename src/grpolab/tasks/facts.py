"""``fact_paraphrase``: short factual questions, each asked in several wordings, answered in a free-form sentence.

A task where consistency is not correctness: the fact check (``accuracy``) reads whether the reply states the
fact; a consistency reward compares the replies to the wordings of one question with each other. A model that
gives the same wrong sentence to every wording is perfectly consistent and always wrong; one that states the
right fact in a different sentence each time is correct and inconsistent (tests/test_paraphrase_groups.py).

Rewards:

* ``accuracy`` (weight 1.0): 1.0 if one of the fact's accepted answers (``answers``: e.g. ``paris``; ``eight``
  or ``8``) is a word of the reply (lower-cased words, :func:`grpolab.tasks.text_similarity.words`), else 0.0.

Columns: ``question`` (the first wording), ``answer`` (the fact's word), ``answers`` (accepted words),
``reference`` (a one-sentence answer), ``paraphrase_group`` (the fact: one set per fact), ``paraphrase_id``
(the wording, 0..n-1). Each wording is its own row with its own prompt; the rows of a fact are contiguous.
"""
from __future__ import annotations

import random

from ..data import completion_text
from ..registry import TASKS, param
from .base import Task, check_held_out, check_range
from .text_similarity import words

SYSTEM = "Answer the question in one short sentence."

# (kind, subject, accepted answers (the first is the fact's word), reference sentence)
FACTS = [
    ("capital", "France", ["paris"], "The capital of France is Paris."),
    ("capital", "Italy", ["rome"], "The capital of Italy is Rome."),
    ("capital", "Spain", ["madrid"], "The capital of Spain is Madrid."),
    ("capital", "Japan", ["tokyo"], "The capital of Japan is Tokyo."),
    ("capital", "Egypt", ["cairo"], "The capital of Egypt is Cairo."),
    ("capital", "Peru", ["lima"], "The capital of Peru is Lima."),
    ("capital", "Kenya", ["nairobi"], "The capital of Kenya is Nairobi."),
    ("capital", "Norway", ["oslo"], "The capital of Norway is Oslo."),
    ("capital", "Greece", ["athens"], "The capital of Greece is Athens."),
    ("capital", "Cuba", ["havana"], "The capital of Cuba is Havana."),
    ("capital", "Austria", ["vienna"], "The capital of Austria is Vienna."),
    ("capital", "Ireland", ["dublin"], "The capital of Ireland is Dublin."),
    ("capital", "Portugal", ["lisbon"], "The capital of Portugal is Lisbon."),
    ("capital", "Poland", ["warsaw"], "The capital of Poland is Warsaw."),
    ("color", "grass", ["green"], "Grass is green."),
    ("color", "snow", ["white"], "Snow is white."),
    ("color", "a clear sky", ["blue"], "A clear sky is blue."),
    ("color", "a ripe banana", ["yellow"], "A ripe banana is yellow."),
    ("color", "coal", ["black"], "Coal is black."),
    ("color", "blood", ["red"], "Blood is red."),
    ("color", "an orange", ["orange"], "An orange is orange."),
    ("color", "a lemon", ["yellow"], "A lemon is yellow."),
    ("legs", "a spider", ["eight", "8"], "A spider has eight legs."),
    ("legs", "a dog", ["four", "4"], "A dog has four legs."),
    ("legs", "a bird", ["two", "2"], "A bird has two legs."),
    ("legs", "an ant", ["six", "6"], "An ant has six legs."),
    ("legs", "a cat", ["four", "4"], "A cat has four legs."),
    ("legs", "a crab", ["ten", "10"], "A crab has ten legs."),
    ("legs", "a horse", ["four", "4"], "A horse has four legs."),
    ("legs", "a bee", ["six", "6"], "A bee has six legs."),
]

WORDINGS = {
    "capital": ["What is the capital of {s}?", "Which city is the capital of {s}?",
                "Name the capital city of {s}.", "{s} has which city as its capital?"],
    "color": ["What color is {s}?", "Which colour does {s} have?", "Name the color of {s}.",
              "Tell me the usual color of {s}."],
    "legs": ["How many legs does {s} have?", "What is the number of legs of {s}?",
             "Count the legs of {s}.", "Tell me how many legs {s} has."],
}


def fact_accuracy(prompts=None, completions=None, answers=None, **kwargs) -> list[float]:
    """1.0 when an accepted answer is a word of the reply (the fact is stated), else 0.0."""
    out = []
    for c, ok in zip(completions, answers):
        said = set(words(completion_text(c)))
        out.append(1.0 if any(a in said for a in ok) else 0.0)
    return out


REWARDS = [("accuracy", fact_accuracy, 1.0)]


@TASKS.register("fact_paraphrase", needs=("text",))
def fact_paraphrase(*,
                    fact_paraphrases: int = param(4, "fact_paraphrase: wordings per fact (2..4): each is its own "
                                                     "prompt, one paraphrase set"),
                    fact_n_eval: int = param(6, "fact_paraphrase: facts held out for evaluation (of 30)"),
                    fact_seed: int = param(1234, "fact_paraphrase: seed of the fact order (fixes the split)")) -> Task:
    """The 30 built-in facts (capitals, colours, leg counts), shuffled by ``fact_seed``; the first
    ``fact_n_eval`` facts are held out. Every fact is asked in ``fact_paraphrases`` wordings, each its own row;
    the rows of a fact form one paraphrase set (column ``paraphrase_group``). Free-form sentence answers.

    Provenance: grpolab's own — a built-in toy task (short factual questions in several wordings, free-form
    answers) for the paraphrase-consistency recipes; implements no published method.
    """
    check_range("fact_paraphrases", fact_paraphrases, 2, 4)
    check_held_out("fact_n_eval", fact_n_eval, len(FACTS))
    facts = list(FACTS)
    random.Random(fact_seed).shuffle(facts)

    def rows_of(part):
        out = []
        for kind, subject, ok, reference in part:
            questions = [w.format(s=subject) for w in WORDINGS[kind]]
            questions = [q[0].upper() + q[1:] for q in questions]
            for k in range(fact_paraphrases):
                out.append({"prompt": [{"role": "system", "content": SYSTEM},
                                       {"role": "user", "content": questions[k]}],
                            "question": questions[0], "answer": ok[0], "answers": list(ok),
                            "reference": reference, "paraphrase_group": f"{kind}:{subject}", "paraphrase_id": k})
        return out

    return Task("fact_paraphrase", rows_of(facts[fact_n_eval:]), rows_of(facts[:fact_n_eval]),
                rewards=list(REWARDS), accuracy_reward="accuracy",
                description=f"short factual questions, each in {fact_paraphrases} wordings (paraphrase sets), "
                            f"free-form sentence answers")
