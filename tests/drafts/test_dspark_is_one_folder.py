"""DSpark is one folder and a registry line (issue 37): outside drafts/dspark/, no code of the package names
it, only its registration in drafts/__init__.py and the target matrix's data (the rows it is tested on).

Code means Python names and string literals, read with ``tokenize``: comments and docstrings may mention
DSpark as prose (the block machinery's docstrings say which families compose it). A change that makes
serve/, eval/, targets/ or another family branch on DSpark, or import from its folder, fails here; so
does one that adds a DSpark literal anywhere else.
"""

import ast
import io
import tokenize
from pathlib import Path

from source_scan import docstring_lines

SRC = Path(__file__).resolve().parents[2] / "src" / "draftsmith"
FOLDER = SRC / "drafts" / "dspark"
# file -> the code lines that may name it (stripped): the registry line's import and register, the matrix rows
ALLOWED = {
    "drafts/__init__.py": {"from . import dflash, dspark, eagle3, peagle  # noqa: E402", "register(dspark.FAMILY)"},
    "targets/support.py": {'families=("eagle3", "dspark")),', 'families=("eagle3", "dspark"),'},
}


def code_mentions(path: Path, word: str = "dspark") -> list[tuple[int, str]]:
    """(line number, stripped line) of each name or string token containing ``word`` outside docstrings."""
    text = path.read_text()
    skip, lines = docstring_lines(ast.parse(text)), text.splitlines()
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.NAME, tokenize.STRING) or getattr(tokenize, "FSTRING_MIDDLE", None) == tok.type:
            if word in tok.string.lower() and tok.start[0] not in skip:
                found.append((tok.start[0], lines[tok.start[0] - 1].strip()))
    return sorted(set(found))


def test_nothing_outside_the_folder_names_dspark_but_its_registration():
    files = [p for p in sorted(SRC.rglob("*.py")) if FOLDER not in p.parents]
    assert len(files) > 80 and any(p.parent.name == "serve" for p in files)  # the scan really reads the package
    found = {}
    for path in files:
        hits = code_mentions(path)
        if hits:
            found[str(path.relative_to(SRC))] = {line for _, line in hits}
    assert found == ALLOWED, f"DSpark named outside drafts/dspark/ (ask the family description instead): {found}"


def test_the_scan_sees_code_and_skips_prose(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('"""DSpark in a docstring."""\n# dspark in a comment\nfrom x import dspark_model\ny = "DSpark"\n')
    assert code_mentions(probe) == [(3, "from x import dspark_model"), (4, 'y = "DSpark"')]
