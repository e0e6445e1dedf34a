"""config.py, train/ and eval/ name no draft family (issue 22): they ask the family description
(drafts.get_family / drafts.family_of_config) instead of keeping their own lists.

What counts: a family name ("eagle3", "peagle", "dflash", "jetspec", "domino") as a whole Python
string literal (tokenised, so f-strings' literal parts count too). Not counted: comments and
docstrings (prose may say "EAGLE-3" or "DFlash"), identifiers (``dflash_config`` is a config.json key,
``dflash_supervision`` a function), and longer strings that contain a name as a word (a message
quoting ``dflash_config.target_layer_ids``); the test shows what it found when it fails.
"""

import ast
import io
import tokenize
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "draftsmith"
NAMES = {"eagle3", "peagle", "dflash", "jetspec", "domino"}
SCOPE = [SRC / "config.py", *sorted((SRC / "train").rglob("*.py")), *sorted((SRC / "eval").rglob("*.py"))]


def docstring_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                lines.add(first.lineno)
    return lines


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


def test_config_train_and_eval_name_no_family():
    assert len(SCOPE) > 10  # the scope is really read
    found = [hit for path in SCOPE for hit in family_literals(path)]
    assert not found, "family names as string literals (ask drafts.get_family instead):\n" + "\n".join(found)


def test_the_check_sees_a_family_literal(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('"""Docstrings may say "dflash"."""\nx = "peagle"  # counted\ny = "dflash_config"  # not a name\n')
    global SRC
    old, SRC = SRC, tmp_path
    try:
        assert family_literals(probe) == ['probe.py:2: "peagle"']
    finally:
        SRC = old
