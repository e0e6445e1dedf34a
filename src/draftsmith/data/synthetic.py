"""Seeded prompt generators for what no offline corpus holds: math word problems, reasoning puzzles
and STEM questions (``builtin:math``, ``builtin:puzzles``, ``builtin:stem``).

The only natural-language word-problem sets on PyPI are evaluation sets (GSM8K and its kin), which a
draft must never train on, so math prompts are built here from templates: rates, percentages, unit
conversions, multi-step shopping and savings, ratios, averages, equations, interest, geometry, time,
probability and fractions, each with several phrasings and an instruction style. Only prompts are
needed (the target writes the answers), so the generators never compute a solution. Every generator
is a function of a :class:`random.Random`: the same seed gives the same prompts, on any machine.
"""

from __future__ import annotations

import random
from typing import Callable, Iterator

NAMES = ["Aisha", "Ben", "Carlos", "Dana", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kofi", "Lena",
         "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Victor", "Wen", "Yara", "Zoe"]
ITEMS = [("notebook", 2, 9), ("backpack", 25, 80), ("pair of headphones", 30, 150), ("lamp", 15, 60),
         ("bicycle", 120, 600), ("coffee mug", 4, 15), ("board game", 18, 55), ("jacket", 40, 200),
         ("plant pot", 3, 20), ("phone case", 8, 35), ("kettle", 20, 70), ("chair", 35, 160)]
GOODS = ["apples", "pencils", "tickets", "bags of rice", "candles", "bottles of juice", "stamps", "tiles",
         "loaves of bread", "packs of cards"]
STYLES = ["{q}", "{q} Show your work.", "Solve step by step: {q}", "{q} Explain your reasoning briefly.",
          "Word problem: {q}", "{q} Give the final answer on its own line.", "Can you help me with this? {q}",
          "{q} Answer with a short explanation and the final number."]


def _money(rng: random.Random, lo: float, hi: float) -> str:
    return f"{rng.uniform(lo, hi):.2f}"


def _rates(r: random.Random) -> str:
    n = r.choice(NAMES)
    d1, d2, v1, v2 = r.randint(20, 200), r.randint(20, 200), r.randrange(30, 120, 5), r.randrange(30, 120, 5)
    return r.choice([
        f"{n} drives {d1} km at {v1} km/h and then {d2} km at {v2} km/h. What is the average speed for the whole trip?",
        f"A cyclist rides at {r.randint(12, 30)} km/h. How long does a {d1} km ride take, in hours and minutes?",
        f"Two trains start {d1 + d2} km apart and travel towards each other at {v1} km/h and {v2} km/h. After how "
        f"many minutes do they meet?",
        f"Pipe A fills a tank in {r.randint(2, 9)} hours and pipe B fills it in {r.randint(3, 12)} hours. How long do "
        f"they take working together?",
        f"{n} can paint a fence in {r.randint(3, 8)} hours; a friend needs {r.randint(4, 10)} hours. If they work "
        f"together for 2 hours and {n} finishes alone, how long does the whole job take?",
        f"A printer prints {r.randint(8, 40)} pages per minute. How many pages does it print in "
        f"{r.randint(2, 5)} hours if it pauses {r.randint(5, 15)} minutes every hour?"])


def _percent(r: random.Random) -> str:
    item, lo, hi = r.choice(ITEMS)
    p, off, tax = _money(r, lo, hi), r.choice([10, 15, 20, 25, 30, 40]), r.choice([5, 7, 8, 10, 12, 19, 20])
    a = r.randint(1_000, 90_000)
    b = int(a * r.uniform(0.6, 1.6))
    return r.choice([
        f"A {item} costs ${p}. It is on sale for {off}% off, and then {tax}% sales tax is added. What is the final price?",
        f"A town's population changed from {a:,} to {b:,} in five years. By what percent did it change?",
        f"After a {off}% discount a {item} costs ${p}. What was the original price?",
        f"{r.choice(NAMES)} scored {r.randint(30, 49)} out of {r.choice([50, 60, 80])} on a test. What percentage is that?",
        f"A salary of ${a:,} rises by {r.randint(2, 9)}% and then by another {r.randint(2, 9)}% the next year. What is "
        f"it after both raises, and what is the total percentage increase?",
        f"A shop marks up goods by {r.choice([20, 25, 40, 50])}% over cost and then offers {off}% off. Does it make a "
        f"profit or a loss, and by what percent of the cost?"])


_UNITS = [("miles", "kilometres", 1.609), ("kilograms", "pounds", 2.205), ("litres", "US gallons", 0.264),
          ("inches", "centimetres", 2.54), ("feet", "metres", 0.3048), ("cups", "millilitres", 236.6),
          ("ounces", "grams", 28.35), ("acres", "square metres", 4047)]


def _units(r: random.Random) -> str:
    a, b, _ = r.choice(_UNITS)
    x = r.choice([r.randint(2, 500), round(r.uniform(0.5, 80), 1)])
    return r.choice([
        f"Convert {x} {a} to {b}.", f"How many {b} are in {x} {a}?",
        f"A recipe needs {x} {a}. What is that in {b}?",
        f"Convert {r.randint(-30, 110)} °F to Celsius.", f"What is {r.randint(-40, 45)} °C in Fahrenheit?",
        f"How many seconds are there in {r.randint(2, 30)} days?",
        f"A car uses {round(r.uniform(4, 12), 1)} litres per 100 km. What is that in miles per US gallon?",
        f"A room is {r.randint(3, 9)} m by {r.randint(3, 9)} m. What is its area in square feet?",
        f"A file is {r.randint(2, 900)} MB and downloads at {r.randint(2, 100)} Mbit/s. How long does it take?"])


def _shopping(r: random.Random) -> str:
    n = r.choice(NAMES)
    g1, g2 = r.sample(GOODS, 2)
    k1, k2 = r.randint(2, 12), r.randint(2, 12)
    p1, p2 = _money(r, 0.5, 6), _money(r, 0.5, 9)
    bill = r.choice([20, 50, 100])
    item, lo, hi = r.choice(ITEMS)
    return r.choice([
        f"{n} buys {k1} {g1} at ${p1} each and {k2} {g2} at ${p2} each, and pays with a ${bill} bill. How much change "
        f"does {n} get?",
        f"{n} saves ${r.randint(5, 60)} a week and already has ${r.randint(0, 200)}. How many weeks until {n} can buy a "
        f"{item} that costs ${r.randint(lo, hi) + 100}?",
        f"A bakery sells {k1 * 10} {g1} a day at ${p1} each. Ingredients cost ${_money(r, 0.1, 0.4)} per item and rent "
        f"is ${r.randint(50, 300)} a day. What is the daily profit?",
        f"{n} has ${bill}. {n} spends a quarter on {g1}, a third of what is left on {g2}, and ${r.randint(1, 9)} on a "
        f"snack. How much money remains?",
        f"Tickets cost ${r.randint(8, 25)} for adults and ${r.randint(4, 12)} for children. A group of {k1} adults and "
        f"{k2} children gets a {r.choice([10, 15, 20])}% group discount. What do they pay in total?"])


def _ratios(r: random.Random) -> str:
    a, b, c = r.randint(1, 5), r.randint(1, 5), r.randint(1, 6)
    n1, n2 = r.sample(NAMES, 2)
    return r.choice([
        f"Concrete is mixed from cement, sand and gravel in the ratio {a}:{b}:{c}. How much sand and gravel go with "
        f"{r.randint(5, 60)} kg of cement?",
        f"{n1} and {n2} share ${r.randint(10, 900) * (a + b)} in the ratio {a}:{b}. How much does each get?",
        f"A map has a scale of 1:{r.choice([25_000, 50_000, 100_000, 250_000])}. Two towns are {round(r.uniform(1, 30), 1)} cm "
        f"apart on the map. How far apart are they in reality, in km?",
        f"A class has {r.randint(12, 30)} students and the ratio of boys to girls is {a}:{b}. Is that possible? If not, "
        f"what is the closest class size that works?"])


def _averages(r: random.Random) -> str:
    scores = [r.randint(55, 98) for _ in range(r.randint(3, 6))]
    return r.choice([
        f"{r.choice(NAMES)}'s test scores are {', '.join(map(str, scores))}. What score on the next test would bring the "
        f"average to {min(99, sum(scores) // len(scores) + r.randint(2, 6))}?",
        f"What are the mean, median and mode of {', '.join(map(str, scores + [r.choice(scores)]))}?",
        f"The average of {len(scores)} numbers is {r.randint(10, 90)}. One number is removed and the average becomes "
        f"{r.randint(10, 90)}. What number was removed?",
        f"A runner's lap times in seconds are {', '.join(str(s + 20) for s in scores)}. What is the average lap time "
        f"and the standard deviation?"])


def _algebra(r: random.Random) -> str:
    a, b, c, d = r.randint(2, 12), r.randint(-20, 20), r.randint(-50, 80), r.randint(2, 9)
    return r.choice([
        f"Solve for x: {a}x + {b} = {c}.", f"Solve {a}(x - {abs(b)}) = {d}x + {c}.",
        f"Solve the system: {a}x + {d}y = {c}, x - y = {b}.",
        f"Find the roots of x^2 + {b}x + {r.randint(-30, 30)} = 0.",
        f"The sum of two numbers is {abs(c) + 10} and their difference is {abs(b) % 9 + 1}. What are the numbers?",
        f"A number is tripled and then {abs(b) + 1} is subtracted, giving {abs(c) + 20}. What is the number?"])


def _interest(r: random.Random) -> str:
    p, rate, years = r.randrange(500, 20_000, 50), r.choice([1.5, 2, 3, 3.5, 4, 5, 6.5]), r.randint(2, 15)
    return r.choice([
        f"${p:,} is invested at {rate}% interest compounded annually. How much is it worth after {years} years?",
        f"What is the simple interest on ${p:,} at {rate}% per year for {years} years?",
        f"A loan of ${p:,} at {rate}% annual interest is repaid in {years * 12} equal monthly payments. Roughly how "
        f"much is each payment?",
        f"How many years does money take to double at {rate}% compound interest? Compare the rule of 72 with the "
        f"exact answer."])


def _geometry(r: random.Random) -> str:
    l, w, p = r.randint(4, 40), r.randint(3, 30), r.choice([0.5, 1, 1.5, 2])
    return r.choice([
        f"A rectangular garden is {l} m by {w} m with a path {p} m wide all around it. What is the area of the path?",
        f"A circular pond has a diameter of {w} m. How much fencing goes around it, and what is its area?",
        f"A ladder {l} ft long leans against a wall with its foot {min(w, l - 1)} ft from the wall. How high up the "
        f"wall does it reach?",
        f"A cylindrical tank has radius {r.randint(1, 5)} m and height {r.randint(2, 10)} m. How many litres does it hold?",
        f"How many {r.choice([20, 30, 40])} cm square tiles cover a floor of {l} m by {w} m?"])


def _time(r: random.Random) -> str:
    h, m, dh, dm = r.randint(0, 23), r.randrange(0, 60, 5), r.randint(0, 9), r.randrange(5, 60, 5)
    return r.choice([
        f"A train leaves at {h:02d}:{m:02d} and the journey takes {dh} h {dm} min. When does it arrive?",
        f"A meeting runs from {h % 12 + 1}:{m:02d} to {(h + dh) % 12 + 1}:{dm:02d}. How long is it?",
        f"{r.choice(NAMES)} sleeps from {r.randint(21, 23)}:{m:02d} to {r.randint(5, 8)}:{dm:02d}. How many hours of "
        f"sleep is that per week?",
        f"A video is {dh + 1} h {dm} min long. At 1.5x speed, how long does it take to watch?"])


def _probability(r: random.Random) -> str:
    red, blue, green = r.randint(2, 9), r.randint(2, 9), r.randint(0, 6)
    return r.choice([
        f"A bag holds {red} red, {blue} blue and {green} green marbles. Two are drawn without replacement. What is "
        f"the probability that both are red?",
        f"Two fair dice are rolled. What is the probability that the sum is {r.randint(3, 11)}?",
        f"A coin is flipped {r.randint(3, 8)} times. What is the probability of exactly {r.randint(1, 3)} heads?",
        f"In a group of {r.randint(10, 40)} people, what is the probability that at least two share a birthday?",
        f"A test is {r.choice([90, 95, 99])}% accurate and {r.choice([1, 2, 5])}% of people have the condition. If "
        f"someone tests positive, what is the chance they have it?"])


def _fractions(r: random.Random) -> str:
    a, b, c, d = r.randint(1, 4), r.randint(5, 9), r.randint(1, 3), r.randint(4, 8)
    return r.choice([
        f"{r.choice(NAMES)} eats {a}/{b} of a pizza and a friend eats {c}/{d} of what is left. What fraction remains?",
        f"What is {a}/{b} + {c}/{d}? Simplify the result.", f"What is {a}/{b} divided by {c}/{d}?",
        f"A tank is {a}/{b} full. After adding {r.randint(10, 90)} litres it is {c + 4}/{d + 5} full. What is its "
        f"capacity?",
        f"What is {r.randint(12, 999)} × {r.randint(12, 99)} - {r.randint(100, 9999)} ÷ {r.choice([2, 4, 5, 8])}?"])


MATH: list[Callable[[random.Random], str]] = [_rates, _percent, _units, _shopping, _ratios, _averages, _algebra,
                                              _interest, _geometry, _time, _probability, _fractions]


def math_prompt(r: random.Random) -> str:
    return r.choice(STYLES).format(q=r.choice(MATH)(r))


# ------------------------------------------------------------------------------ reasoning
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
PETS = ["a cat", "a dog", "a parrot", "a goldfish", "a rabbit", "a tortoise"]
JOBS = ["a doctor", "a pilot", "a chef", "a teacher", "an engineer", "a painter"]
CITIES = ["London", "New York", "Tokyo", "Sydney", "Nairobi", "São Paulo", "Mumbai", "Berlin", "Los Angeles"]
OFFSETS = {"London": 0, "New York": -5, "Tokyo": 9, "Sydney": 10, "Nairobi": 3, "São Paulo": -3, "Mumbai": 5.5,
           "Berlin": 1, "Los Angeles": -8}
GROUPS = ["cats", "mammals", "pilots", "musicians", "students", "birds", "engineers", "gardeners", "poets", "runners"]
REASON_STYLES = ["{q}", "{q} Think it through step by step.", "Puzzle: {q}", "{q} Explain how you got the answer.",
                 "Here is a logic question. {q}", "{q} Be careful, it may be a trick question."]


def _ordering(r: random.Random) -> str:
    people = r.sample(NAMES, r.randint(3, 5))
    rel = r.choice([("taller", "shorter", "tallest", "shortest"), ("older", "younger", "oldest", "youngest"),
                    ("faster", "slower", "fastest", "slowest")])
    clues = [f"{a} is {rel[0]} than {b}" if r.random() < 0.6 else f"{b} is {rel[1]} than {a}"
             for a, b in zip(people, people[1:])]
    r.shuffle(clues)
    return f"{'. '.join(clues)}. Who is the {r.choice(rel[2:])}, and can you rank all of them?"


def _knights(r: random.Random) -> str:
    a, b = r.sample(NAMES, 2)
    says = r.choice([(f"{b} is a knave", "we are both knights"), ("we are both knaves", f"{a} is a knight"),
                     (f"{b} and I are different kinds", f"{a} is lying"), ("at least one of us is a knave", "")])
    tail = f" {b} says: '{says[1]}'." if says[1] else ""
    return (f"On an island, knights always tell the truth and knaves always lie. {a} says: '{says[0]}'.{tail} "
            f"What are {a} and {b}?")


def _grid(r: random.Random) -> str:
    people, pets, jobs = r.sample(NAMES, 3), r.sample(PETS, 3), r.sample(JOBS, 3)
    clues = [f"{people[0]} does not own {pets[1]}", f"the person who owns {pets[0]} is {jobs[0]}",
             f"{people[1]} is not {jobs[0]}", f"{people[2]} owns {pets[2]}", f"{people[1]} is {jobs[1]}"]
    r.shuffle(clues)
    return (f"{', '.join(people[:2])} and {people[2]} each own one pet ({', '.join(pets)}) and have different jobs "
            f"({', '.join(jobs)}). Clues: " + "; ".join(clues) + ". Who owns which pet and does which job?")


def _sequences(r: random.Random) -> str:
    a, d, k = r.randint(1, 20), r.randint(2, 9), r.randint(2, 3)
    kind = r.randrange(5)
    if kind == 0:
        seq = [a + d * i for i in range(5)]
    elif kind == 1:
        seq = [a * k ** i for i in range(5)]
    elif kind == 2:
        seq = [(i + a % 5 + 1) ** 2 for i in range(5)]
    elif kind == 3:
        seq = [a, d]
        for _ in range(4):
            seq.append(seq[-1] + seq[-2])
    else:
        seq = [a + (d if i % 2 else -k) * i for i in range(6)]
    return f"What comes next in the sequence {', '.join(map(str, seq))}, ...? Explain the rule."


def _syllogism(r: random.Random) -> str:
    x, y, z = r.sample(GROUPS, 3)
    q = r.choice(["All", "Some", "No"])
    return (f"{q} {x} are {y}. {r.choice(['All', 'Some'])} {y} are {z}. Does it follow that {r.choice(['some', 'all'])} "
            f"{x} are {z}? Is the argument valid?")


def _calendar(r: random.Random) -> str:
    c1, c2 = r.sample(CITIES, 2)
    h = r.randint(6, 22)
    return r.choice([
        f"If today is {r.choice(DAYS)}, what day of the week will it be in {r.randint(10, 400)} days?",
        f"A call is set for {h}:00 in {c1}. What time is it in {c2}? (UTC offsets: {c1} {OFFSETS[c1]:+g}, "
        f"{c2} {OFFSETS[c2]:+g}.)",
        f"A flight leaves {c1} at {h}:30 local time and lands in {c2} {r.randint(2, 14)} hours later. What is the "
        f"local time on landing? (UTC offsets: {c1} {OFFSETS[c1]:+g}, {c2} {OFFSETS[c2]:+g}.)",
        f"If the {r.randint(1, 28)}th of a month is a {r.choice(DAYS)}, what day is the {r.randint(1, 28)}th of the "
        f"same month?"])


def _counting(r: random.Random) -> str:
    n = r.randint(4, 30)
    word = r.choice(["bookkeeper", "mississippi", "strawberry", "assessment", "parallelogram", "committee",
                     "bananarama", "possession", "independence", "accommodation"])
    return r.choice([
        f"At a party {n} people each shake hands once with everyone else. How many handshakes are there?",
        f"How many times does the letter '{r.choice(sorted(set(word)))}' appear in the word '{word}'?",
        f"In how many ways can {min(n, 8)} people sit in a row if two of them refuse to sit next to each other?",
        f"A clock strikes once at 1 o'clock, twice at 2, and so on. How many strikes in {r.choice([12, 24])} hours?",
        f"I have {n} socks in a drawer, half black and half white. How many must I take in the dark to be sure of a "
        f"matching pair?",
        f"{r.choice(NAMES)} has {r.randint(2, 6)} sisters and each sister has {r.randint(1, 3)} brothers. How many "
        f"children are in the family at least?"])


REASONING: list[Callable[[random.Random], str]] = [_ordering, _knights, _grid, _sequences, _syllogism, _calendar,
                                                   _counting]


def reasoning_prompt(r: random.Random) -> str:
    return r.choice(REASON_STYLES).format(q=r.choice(REASONING)(r))


# ------------------------------------------------------------------------------ STEM
STEM_CONCEPTS = {
    "physics": ["Newton's third law", "conservation of momentum", "entropy", "the photoelectric effect",
                "special relativity's time dilation", "quantum tunnelling", "resonance", "the Doppler effect",
                "buoyancy", "terminal velocity", "superconductivity", "wave-particle duality", "angular momentum",
                "the speed of sound in different media", "nuclear fission versus fusion"],
    "chemistry": ["covalent versus ionic bonds", "pH and buffers", "catalysts", "oxidation and reduction",
                  "Le Chatelier's principle", "isotopes", "polymers", "electronegativity", "activation energy",
                  "chirality", "the ideal gas law", "why ice floats"],
    "biology": ["natural selection", "CRISPR gene editing", "how vaccines train the immune system", "photosynthesis",
                "cellular respiration", "mitosis versus meiosis", "the gut microbiome", "antibiotic resistance",
                "how neurons fire", "protein folding", "epigenetics", "the carbon cycle", "homeostasis"],
    "earth and space": ["plate tectonics", "the greenhouse effect", "ocean currents", "how hurricanes form",
                        "black holes", "the life cycle of a star", "tides", "the water cycle", "exoplanet detection",
                        "seasons and axial tilt", "earthquakes and the Richter scale", "cosmic microwave background"],
    "computing": ["public-key cryptography", "hash tables", "garbage collection", "TCP versus UDP",
                  "how a CPU cache works", "big-O notation", "database indexing", "virtual memory",
                  "floating-point rounding errors", "how DNS works", "gradient descent", "transformers in "
                  "machine learning", "the CAP theorem", "compilers versus interpreters", "containerisation"],
    "engineering": ["how a transistor works", "PID controllers", "heat pumps", "how lithium-ion batteries work",
                    "stress and strain in materials", "alternating versus direct current", "how bridges carry "
                    "loads", "signal-to-noise ratio", "how GPS determines position", "how solar cells work"],
    "mathematics and statistics": ["Bayes' theorem", "the central limit theorem", "p-values", "eigenvectors",
                                   "the Fourier transform", "prime factorisation", "derivatives as rates of change",
                                   "correlation versus causation", "exponential growth", "Markov chains",
                                   "confidence intervals", "the Monty Hall problem"],
    "medicine": ["blood pressure", "how anaesthesia works", "type 1 versus type 2 diabetes", "the placebo effect",
                 "how MRI scanners work", "cholesterol", "sleep cycles", "randomised controlled trials"],
}
AUDIENCES = ["a ten-year-old", "a high-school student", "a first-year university student", "a curious adult with "
             "no science background", "an engineer from another field", "a policy maker"]
STEM_TEMPLATES = [
    "Explain {c} to {aud}.", "What is {c}, and why does it matter in {field}?",
    "Give an intuitive explanation of {c} with a real-world example.",
    "What are common misconceptions about {c}?", "Compare {c} with {c2}. How are they related, if at all?",
    "How would you design a simple experiment or demonstration to show {c}?",
    "Write a short explainer on {c} for {aud}, then give three quiz questions with answers.",
    "What are the key equations or rules behind {c}? Explain each term.",
    "What is the history of {c}? Who discovered or developed it, and how?",
    "I keep getting confused about {c}. Can you break it down step by step?",
]


def stem_prompt(r: random.Random) -> str:
    field = r.choice(sorted(STEM_CONCEPTS))
    c, c2 = r.sample(STEM_CONCEPTS[field], 2)
    return r.choice(STEM_TEMPLATES).format(c=c, c2=c2, field=field, aud=r.choice(AUDIENCES))


GENERATORS: dict[str, tuple[str, Callable[[random.Random], str]]] = {
    "math": ("math", math_prompt), "puzzles": ("reasoning", reasoning_prompt), "stem": ("stem", stem_prompt)}


def generate(name: str, seed: int) -> Iterator[tuple[str, str]]:
    """An endless stream of ``(category, prompt)`` from generator ``name`` (math, puzzles, stem), seeded."""
    category, make = GENERATORS[name]
    r = random.Random(f"{name}:{seed}")  # a str seed hashes the same on every machine and Python run
    while True:
        yield category, make(r)
