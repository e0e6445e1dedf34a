"""The prompt corpora's install lists agree (pyproject extra `data`, the Makefile, the install hints) and
docs/guides/data.md's table names every built-in corpus."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftsmith.data.corpora import CORPORA


def test_install_lists_agree():
    """pyproject's extra `data`, the Makefile's DATA_CORPORA and the install hints name the same pins."""
    import re

    from draftsmith.data.sources import _WHEELS

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    root = Path(__file__).resolve().parents[2]
    extra = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["data"]
    make = re.search(r"^DATA_CORPORA := (.*?)\n(?!\t)", (root / "Makefile").read_text(), re.M | re.S).group(1)
    hints = [w.split()[-1] for w in _WHEELS.values() if w.startswith("--no-deps ")]
    assert sorted(extra) == sorted(make.replace("\\", " ").split()) == sorted(hints)
    needed = {m for c in CORPORA.values() for m in c.modules}
    assert needed == {m for m, w in _WHEELS.items() if w.startswith("--no-deps ")}
    table = [ln for ln in (root / "docs" / "guides" / "data.md").read_text().splitlines() if ln.startswith("| `builtin:")]
    missing = [name for name in CORPORA if not any(f"`builtin:{name}`" in ln.split("|")[1] for ln in table)]
    assert not missing, f"docs/guides/data.md's table of sources and licenses lacks {missing}"
