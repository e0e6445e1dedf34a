"""A ``draftsmith regenerate`` output dir: its manifest and shards, read back and checked.

Written by :mod:`draftsmith.data.regenerate`; read by the sources (a regenerated dir is a data
source, :mod:`draftsmith.data.sources`) and by training, which renders with the chat-template
kwargs the text was made with (:func:`template_kwargs_of`). Every file is written whole
(:mod:`draftsmith.atomic`), so a kill never leaves half a shard or manifest.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional, Sequence

from draftsmith import atomic
from draftsmith.data.formats import DataError

MANIFEST = "manifest.json"
FORMAT = "draftsmith.regenerated"
VERSION = 1


class RegenError(DataError):
    """``draftsmith regenerate`` input that cannot work: a flag value, a target without a chat template, an
    answering server that fails, a damaged output dir. Fix: correct what the message names and rerun the
    same command; it resumes from the shards already written."""


class RegenMismatch(RegenError):
    """The ``--out`` dir of ``draftsmith regenerate`` was written with other settings (or by another
    version's fingerprinting), so resuming it would mix two datasets. Fix: rerun with the settings the
    message lists, or pick another ``--out``."""


def shard_name(index: int) -> str:
    return f"shard-{index:06d}.jsonl"


def read_manifest(out: Path) -> Optional[dict]:
    """The manifest of a regenerated dir, or None when ``out`` has none."""
    path = Path(out) / MANIFEST
    if not path.is_file():
        return None
    try:
        m = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise RegenError(f"{path}: not valid JSON ({e}); delete the dir or pick another --out") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise RegenError(f"{path}: not a draftsmith regenerate manifest; pick another --out")
    return m


def regenerated_manifest(path: str | os.PathLike) -> Optional[dict]:
    """The manifest when ``path`` is a ``draftsmith regenerate`` output dir, else None."""
    f = Path(path) / MANIFEST
    if not f.is_file():
        return None
    try:
        m = json.loads(f.read_text())
    except (ValueError, UnicodeDecodeError):
        return None
    return m if isinstance(m, dict) and m.get("format") == FORMAT else None


def check_resume(path: Path, was: dict, now: dict) -> None:
    """Refuse to resume a dir whose manifest ``settings`` (``was``) differ from this run's (``now``), naming them."""
    changed = [f"{k} {json.dumps(was.get(k))} -> {json.dumps(now.get(k))}" for k in sorted(set(was) | set(now))
               if was.get(k) != now.get(k)]
    if changed:
        raise RegenMismatch(f"{path}: this dir was regenerated with other settings ({'; '.join(changed[:4])}); rerun with "
                         "its settings to resume, or pick another --out")


def shard_rows(path: Path) -> list[dict]:
    """The rows of one shard. Lines end at "\\n" only: text may hold U+2028 and other characters
    that ``str.splitlines`` would also split at (json.dumps leaves them raw with ensure_ascii=False)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line]


def finish(out: Path, manifest: dict, n_shards: int, extra_counts: dict) -> None:
    """Count what the shards hold and mark the manifest complete (written atomically, last)."""
    rows_total, turns, chars = 0, 0, 0
    by_source: dict[str, int] = {}
    by_category: dict[str, int] = {}
    for i in range(n_shards):
        for row in shard_rows(out / shard_name(i)):
            rows_total += 1
            turns += sum(m["role"] == "assistant" for m in row["messages"])
            chars += sum(len(m["content"]) for m in row["messages"] if m["role"] == "assistant")
            # what the dir holds, per source and per category (rows written before rows carried tags: "unknown")
            source, category = str(row.get("source", "unknown")), str(row.get("category", "uncategorized"))
            by_source[source] = by_source.get(source, 0) + 1
            by_category[category] = by_category.get(category, 0) + 1
    manifest["counts"] = {"conversations": rows_total, "assistant_turns": turns, "assistant_chars": chars,
                          "shards": n_shards, **extra_counts, "sources": dict(sorted(by_source.items())),
                          "categories": dict(sorted(by_category.items()))}
    manifest["shards"] = [shard_name(i) for i in range(n_shards)]
    manifest["complete"] = True
    atomic.write_json(out / MANIFEST, manifest)


def template_kwargs_of(specs: Sequence[str]) -> Optional[dict]:
    """The chat-template kwargs the regenerated dirs among ``specs`` were made with (None when no spec
    is one). Dirs made with different kwargs cannot train one draft: that is a :class:`RegenError`."""
    found: dict[str, dict] = {}
    for spec in specs:
        p = Path(str(spec)).expanduser()
        m = regenerated_manifest(p) if p.is_dir() else None
        if m is not None:
            found[str(p)] = dict(m.get("chat_template_kwargs") or {})
    kinds = {json.dumps(v, sort_keys=True) for v in found.values()}
    if len(kinds) > 1:
        detail = "; ".join(f"{k}: {json.dumps(v)}" for k, v in found.items())
        raise RegenError(f"data.sources: regenerated with different chat-template kwargs ({detail}); train on dirs "
                         "made with the same kwargs (the ones you will serve with)")
    return next(iter(found.values())) if found else None
