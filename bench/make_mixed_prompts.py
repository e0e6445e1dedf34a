"""Build the shipped `mixed` prompt set from the three shipped sets, deterministically.

    .venv/bin/python bench/make_mixed_prompts.py            # (re)writes src/draftsmith/eval/prompt_sets/mixed.jsonl
    .venv/bin/python bench/make_mixed_prompts.py --check    # exit 1 if the file differs from what this builds

Why: drafts are judged on MT-Bench alone, but users also send math, code and LONG prompts, where
acceptance (and the cost of a long prefill) differ. `mixed` is a held-out set with all of them, made
ONLY from mt_bench.jsonl, gsm8k_test_200.jsonl and humaneval.jsonl (licenses beside them), so it
carries no new third-party text:

- short rows, copied verbatim (first turn only): chat (MT-Bench writing/roleplay/humanities), math
  (GSM8K), coding (HumanEval), reasoning, stem and extraction (MT-Bench);
- long rows, built by concatenation: `long_code` (a module of HumanEval stubs + a question about it),
  `long_math` (numbered GSM8K problems + "solve problem k"), `long_passage` (numbered MT-Bench
  requests + summarise / group / answer one).

Long rows are packed to a CHARACTER budget, not a token one, so the output depends only on this
script and the three source files (no tokenizer needed to rebuild it byte for byte); the budgets are
chosen so every long row renders to ~800-1,800 SmolLM2 tokens with the chat template (prompt + 128
generated tokens fit vLLM's max_model_len 2048). tests/eval/test_prompts.py checks both the token
bound and that this script reproduces the file. Rows are interleaved across categories so the first
N rows (`--prompts N`) are already a mix.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
SETS = ROOT / "src" / "draftsmith" / "eval" / "prompt_sets"
OUT = SETS / "mixed.jsonl"
SEED = 20240611

# Short rows per category: (category, source file, source categories, how many).
SHORT = [
    ("chat", "mt_bench.jsonl", ("writing", "roleplay", "humanities"), 10),
    ("math", "gsm8k_test_200.jsonl", ("math",), 10),
    ("coding", "humaneval.jsonl", ("coding",), 10),
    ("reasoning", "mt_bench.jsonl", ("reasoning",), 4),
    ("stem", "mt_bench.jsonl", ("stem",), 4),
    ("extraction", "mt_bench.jsonl", ("extraction",), 4),
]
LONG_PER_KIND = 6
# Character budgets per long kind, measured against SmolLM2's tokenizer (code ~3.2 chars per token,
# GSM8K problems ~3.7, MT-Bench requests ~4): the rows land at ~1,000-1,650 tokens after the chat template.
LONG_CHARS = {"long_code": (2800, 5300), "long_math": (3200, 6200), "long_passage": (3500, 6600)}
HUMANEVAL_LEAD = "Complete the following Python function.\n\n"

CODE_TASKS = [
    "Explain what each function in this module does, one short paragraph per function.",
    "Implement the function `{name}` from this module. Reply with only the code of that function.",
    "Write pytest unit tests for the function `{name}`, covering the examples in its docstring and two edge cases.",
]
MATH_TASKS = [
    "Solve problem {k} step by step.",
    "Solve problems {k} and {j} step by step, then say which answer is larger.",
    "Which of these problems involve money? List their numbers, then solve the first of them step by step.",
]
PASSAGE_TASKS = [
    "Summarise these requests in five bullet points: what do users mostly ask the assistant for?",
    "Group the requests by topic and give each group a short title and the request numbers in it.",
    "Answer request {k}.",
]


def read_rows(name: str) -> list[dict]:
    """The rows of a shipped set, in file order."""
    return [json.loads(line) for line in (SETS / name).read_text(encoding="utf-8").splitlines() if line.strip()]


def pack(rng: random.Random, pool: list, size: Callable[[object], int], budget: int) -> list:
    """A random subset of ``pool`` (in the shuffled order) whose total ``size`` stays within ``budget``."""
    order = pool[:]
    rng.shuffle(order)
    picked, total = [], 0
    for item in order:
        if total + size(item) > budget:
            continue  # a smaller item later may still fit; keeps lengths close to the budget
        picked.append(item)
        total += size(item)
    return picked


def humaneval_module(stubs: list[str]) -> tuple[str, list[str]]:
    """HumanEval prompts -> one module (imports deduplicated at the top) and each stub's entry point."""
    imports, bodies, names = [], [], []
    for stub in stubs:
        code = stub[len(HUMANEVAL_LEAD):] if stub.startswith(HUMANEVAL_LEAD) else stub
        body = []
        for line in code.splitlines():
            if line.startswith(("import ", "from ")):
                if line not in imports:
                    imports.append(line)
            else:
                body.append(line)
        bodies.append("\n".join(body).strip("\n") + "\n    ...\n")  # the stub's body is left to the model
        names.append(re.findall(r"^def (\w+)", code, flags=re.M)[-1])  # the entry point is defined last
    head = "\n".join(imports) + "\n\n\n" if imports else ""
    return head + "\n\n".join(bodies), names


def long_rows(rng: random.Random, mt: list[dict], gsm: list[dict], he: list[dict]) -> dict[str, list[dict]]:
    """The three kinds of long rows, ``LONG_PER_KIND`` each."""
    out: dict[str, list[dict]] = {k: [] for k in LONG_CHARS}
    he_turns = [r["turns"][0] for r in he]
    gsm_turns = [r["turns"][0] for r in gsm]
    mt_turns = [r["turns"][0] for r in mt]
    for i in range(LONG_PER_KIND):
        stubs = pack(rng, he_turns, len, rng.randint(*LONG_CHARS["long_code"]))
        module, names = humaneval_module(stubs)
        task = CODE_TASKS[i % len(CODE_TASKS)].format(name=rng.choice(names))
        out["long_code"].append({"turns": [f"Here is a Python module:\n\n```python\n{module}```\n\n{task}"]})

        problems = pack(rng, gsm_turns, len, rng.randint(*LONG_CHARS["long_math"]))
        k, j = sorted(rng.sample(range(1, len(problems) + 1), 2))
        listing = "\n\n".join(f"{n}. {p.strip()}" for n, p in enumerate(problems, 1))
        task = MATH_TASKS[i % len(MATH_TASKS)].format(k=k, j=j)
        out["long_math"].append({"turns": [f"Here are {len(problems)} math word problems:\n\n{listing}\n\n{task}"]})

        requests = pack(rng, mt_turns, len, rng.randint(*LONG_CHARS["long_passage"]))
        listing = "\n\n".join(f"Request {n}: {p.strip()}" for n, p in enumerate(requests, 1))
        task = PASSAGE_TASKS[i % len(PASSAGE_TASKS)].format(k=rng.randint(1, len(requests)))
        out["long_passage"].append({"turns": [f"Here are {len(requests)} requests that users sent to an AI "
                                              f"assistant:\n\n{listing}\n\n{task}"]})
    return out


def build() -> list[dict]:
    """Every row of mixed.jsonl, in file order (interleaved across categories)."""
    rng = random.Random(SEED)
    sources = {name: read_rows(name) for name in ("mt_bench.jsonl", "gsm8k_test_200.jsonl", "humaneval.jsonl")}
    groups: dict[str, list[dict]] = {}
    for category, name, from_cats, n in SHORT:
        pool = [r for r in sources[name] if r["category"] in from_cats]
        picked = sorted(rng.sample(range(len(pool)), n))  # source order inside a category: easy to audit
        groups[category] = [{"id": f"mixed-{pool[i]['id']}", "category": category, "turns": pool[i]["turns"][:1]}
                            for i in picked]
    for kind, rows in long_rows(rng, sources["mt_bench.jsonl"], sources["gsm8k_test_200.jsonl"],
                                sources["humaneval.jsonl"]).items():
        groups[kind] = [{"id": f"mixed-{kind}-{n}", "category": kind, **r} for n, r in enumerate(rows, 1)]
    rows, depth = [], max(len(g) for g in groups.values())
    for n in range(depth):  # round robin, so any prefix of the file mixes the categories
        rows += [g[n] for g in groups.values() if n < len(g)]
    return rows


def render(rows: list[dict]) -> str:
    """The file's exact text: one JSON object per line, UTF-8 kept as is (as the source sets are)."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed file instead of writing it")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    text = render(build())
    out = Path(args.out)
    if args.check:
        same = out.is_file() and out.read_text(encoding="utf-8") == text
        print(f"{out}: {'up to date' if same else 'DIFFERS; rerun bench/make_mixed_prompts.py and commit it'}")
        return 0 if same else 1
    out.write_text(text, encoding="utf-8", newline="\n")
    print(f"wrote {out} ({text.count(chr(10))} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
