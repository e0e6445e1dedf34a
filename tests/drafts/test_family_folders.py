"""A family folder imports no other family's folder: "compose shared pieces; do not inherit another family's
model". What two families share is a module of drafts/ (block.py, block_infer.py, ... for the block families;
eagle_config.py, eagle_layers.py, ... for EAGLE-3 and P-EAGLE), so each folder holds its family and nothing of
another's, and a change to one family cannot break another through its folder.

A family's folder is the package of its ``api`` module (JetSpec and Domino have theirs inside dflash/, so they
are that folder). Every import statement of every module in a folder counts, read with ``ast`` (nothing is
imported): module level, inside functions and classes, under ``if TYPE_CHECKING:``, relative or absolute.
"""

from __future__ import annotations

import ast
from pathlib import Path

from draftsmith.drafts import FAMILIES

SRC = Path(__file__).resolve().parents[2] / "src"
DRAFTS = SRC / "draftsmith" / "drafts"


def module_of(path: Path, src: Path) -> str:
    """``src/draftsmith/drafts/peagle/model.py`` -> ``draftsmith.drafts.peagle.model`` (a package is its __init__)."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def family_folders() -> dict[str, Path]:
    """Folder package (``draftsmith.drafts.dflash``) -> its directory, for every registered family whose api
    module lives in a folder under drafts/ (a family registered from outside draftsmith has none here)."""
    out = {}
    for family in FAMILIES.values():
        package = family.api.rpartition(".")[0]
        folder = SRC.joinpath(*package.split("."))
        if folder.parent == DRAFTS and (folder / "__init__.py").is_file():
            out[package] = folder
    return out


def imported_modules(module: str, is_package: bool, tree: ast.AST) -> list[tuple[int, str]]:
    """(line, absolute dotted name) of everything ``module`` imports, anywhere in its source. ``from x import
    y`` gives ``x.y`` as well as ``x``: ``y`` may be a module (``from .. import peagle``)."""
    base = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                stem = base[: len(base) - node.level + 1]
                source = ".".join(stem + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            found.append((node.lineno, source))
            found += [(node.lineno, f"{source}.{a.name}") for a in node.names]
    return found


def foreign_imports(folders: dict[str, Path], src: Path = SRC) -> list[str]:
    """One line per import, in a family folder, of another family folder's package or of a module in it
    (``src``: the directory holding the ``draftsmith`` package)."""
    bad: dict[tuple[str, int], str] = {}  # (file, line) -> the first foreign name that statement imports
    for package, folder in sorted(folders.items()):
        others = [p for p in folders if p != package]
        for path in sorted(folder.rglob("*.py")):
            module = module_of(path, src)
            tree = ast.parse(path.read_text(), str(path))
            for line, name in imported_modules(module, path.name == "__init__.py", tree):
                hit = next((p for p in others if name == p or name.startswith(p + ".")), None)
                if hit:
                    where = (str(path.relative_to(src)), line)
                    bad.setdefault(where, f"{where[0]}:{line} imports {name} (the {hit.rpartition('.')[2]}/ folder)")
    return [bad[k] for k in sorted(bad)]


def test_the_registered_families_have_their_folders():
    # guards the scan: if the folders were not found it would pass vacuously; JetSpec and Domino are dflash/'s
    folders = family_folders()
    assert {"draftsmith.drafts.eagle3", "draftsmith.drafts.peagle", "draftsmith.drafts.dflash",
            "draftsmith.drafts.dspark"} <= set(folders)
    assert {FAMILIES[n].api.rpartition(".")[0] for n in ("dflash", "jetspec", "domino")} == {"draftsmith.drafts.dflash"}


def test_no_family_folder_imports_another_family_folder():
    bad = foreign_imports(family_folders())
    assert not bad, ("a family folder imports another family's folder; move what they share to a module of drafts/ "
                     "(as block.py and eagle_layers.py are) and import it from there:\n" + "\n".join(bad))


def test_the_scan_sees_every_kind_of_import(tmp_path):
    # the real folders' layout, with one module per way of importing a neighbour: each must be reported, and
    # imports of drafts/'s shared modules or of the folder's own modules must not
    drafts = tmp_path / "draftsmith" / "drafts"
    for name in ("alpha", "beta"):
        (drafts / name).mkdir(parents=True)
        (drafts / name / "__init__.py").write_text("")
    (drafts / "__init__.py").write_text("")
    (drafts / "shared.py").write_text("")
    (drafts / "alpha" / "ok.py").write_text("from ..shared import x\nfrom . import model\nimport draftsmith.drafts.shared\n")
    (drafts / "alpha" / "relative.py").write_text("from ..beta.model import Model\n")
    (drafts / "alpha" / "package.py").write_text("from .. import beta\n")
    (drafts / "alpha" / "absolute.py").write_text("import draftsmith.drafts.beta.config\n")
    (drafts / "alpha" / "lazy.py").write_text("def f():\n    from draftsmith.drafts.beta import FAMILY\n")
    (drafts / "alpha" / "__init__.py").write_text("from ..beta import is_beta\n")
    bad = foreign_imports({f"draftsmith.drafts.{n}": drafts / n for n in ("alpha", "beta")}, tmp_path)
    files = sorted({line.split(":")[0] for line in bad})
    assert files == [f"draftsmith/drafts/alpha/{n}.py" for n in ("__init__", "absolute", "lazy", "package", "relative")], bad
