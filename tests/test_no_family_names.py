"""No package outside drafts/ names a draft family (issues 22, 37): they ask the family description
(drafts.get_family / drafts.family_of_config) instead of keeping their own lists, so a family added in
its own folder needs no edit anywhere else.

Scope: every module of the package except drafts/ (where the families live) and recipe/ (it translates
NeMo AutoModel's recipe format, whose own keys name families). What is still pending is listed in
PENDING by file and literal, and the test fails both when a new literal appears and when a pending one
is gone (it grows only with the matrix, a row tested with one more family): targets/support.py's matrix lists which families a row is tested
with. (The supervision kinds and layer-id rules, named after the families that introduced them, left
targets/contract.py for drafts/, beside the families that share them: drafts/eagle_supervision.py,
drafts/block_supervision.py.)

What counts: a family name ("eagle3", "peagle", "dflash", "jetspec", "domino", "dspark") as a whole Python
string literal (tokenised, so f-strings' literal parts count too). Not counted: comments and
docstrings (prose may say "EAGLE-3" or "DFlash"), identifiers (``dflash_config`` is a config.json key,
``dflash_supervision`` a function), and longer strings that contain a name as a word (a message
quoting ``dflash_config.target_layer_ids``); the test shows what it found when it fails.
"""

import ast
import io
import tokenize
from pathlib import Path

from source_scan import docstring_lines

SRC = Path(__file__).resolve().parents[1] / "src" / "draftsmith"
NAMES = {"eagle3", "peagle", "dflash", "jetspec", "domino", "dspark"}
OUTSIDE = ("drafts", "recipe")
SCOPE = [p for p in sorted(SRC.rglob("*.py")) if p.relative_to(SRC).parts[0] not in OUTSIDE]
# file -> the literals still there (see the docstring); counts, so a second copy is a new literal
PENDING = {
    "targets/support.py": {'"eagle3"': 4, '"dflash"': 1, '"dspark"': 2},  # the matrix's rows: data, not branches
}


def family_literals(path: Path) -> list[str]:
    text = path.read_text()
    skip = docstring_lines(ast.parse(text))
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.STRING and tok.start[0] not in skip:
            value = ast.literal_eval(tok.string) if not tok.string.lstrip("rbRB").startswith(("f", "F")) else None
            if value in NAMES:
                found.append(f"{path.relative_to(SRC)}:{tok.start[0]}: {tok.string}")
        elif getattr(tokenize, "FSTRING_MIDDLE", None) == tok.type and tok.string in NAMES:
            found.append(f"{path.relative_to(SRC)}:{tok.start[0]}: {tok.string}")
    return found


def test_no_package_outside_drafts_names_a_family():
    assert len(SCOPE) > 60 and any(p.parts[-2] == "serve" for p in SCOPE)  # the scope is really read
    found: dict[str, dict[str, int]] = {}
    for path in SCOPE:
        for hit in family_literals(path):
            where, _, literal = hit.partition(": ")
            counts = found.setdefault(where.split(":")[0], {})
            counts[literal] = counts.get(literal, 0) + 1
    new = {f: c for f, c in found.items() if c != PENDING.get(f)}
    gone = {f: c for f, c in PENDING.items() if f not in found}
    assert not new and not gone, (
        "family names as string literals outside drafts/ (ask drafts.get_family instead); if one of PENDING was "
        f"removed, shrink PENDING:\nfound {new}\npending but gone {gone}")


def test_the_check_sees_a_family_literal(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('"""Docstrings may say "dflash"."""\nx = "peagle"  # counted\ny = "dflash_config"  # not a name\n')
    global SRC
    old, SRC = SRC, tmp_path
    try:
        assert family_literals(probe) == ['probe.py:2: "peagle"']
    finally:
        SRC = old
