"""Hugging Face hub ids (``org/name``) for targets and datasets, resolved offline-first.

A target ``org/name`` and a data source ``org/name`` or ``org/name:split[slice]`` (e.g.
``HuggingFaceH4/ultrachat_200k:train_sft[:200000]``), for a repo of several configs (subsets)
``org/name:config`` or ``org/name:config:split[slice]`` (``openai/gsm8k:main:train[:100]``), are read from the local hub cache
(``HF_HUB_CACHE``, else ``HF_HOME/hub``, else huggingface_hub's default): the
``models--org--name`` / ``datasets--org--name`` folders whose ``refs/main`` names a
``snapshots/<commit>/`` directory, as ``hf download`` and ``datasets.load_dataset`` leave them.
Only when an id is not cached and the network is allowed (``HF_HUB_OFFLINE`` unset) is it downloaded
into that cache; with the network off a miss is one line naming the id and the ``hf download`` command
that fetches it. Both are read at call time, so a test (or a user) can point them elsewhere per run.

A dataset snapshot is read with ``datasets.load_dataset(<snapshot dir>, split=...)``: the same split
inference (file-name patterns such as ``data/train_sft-00000-of-00003.parquet``, or the README's
``configs:``) and slice syntax (``train[:1000]``, ``train[10%:]``) as loading the id from the Hub, but
offline by construction -- ``load_dataset("org/name")`` itself ignores the hub snapshot when offline.

This module raises :class:`HubError`; callers turn it into their own one-line error (TargetError,
DataError) so the CLI exits with code 2.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterator, Optional

# org/name: the Hub's own rule (letters, digits, `-`, `_`, `.`), one slash, no path-like leading dot.
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
# what follows a dataset id: `:split` with an optional `[slice]` (datasets' split syntax), or
# `:config:split[slice]` for a repo of several configs (subsets), e.g. `openai/gsm8k:main:train[:100]`
_SPLIT = re.compile(r"([A-Za-z0-9_.-]+:)?[A-Za-z0-9_.-]+(\[[^\]]*\])?")
# local file names that look like org/name: a missing `data/train.jsonl` is a missing file, not a hub id
_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".yaml", ".yml", ".safetensors", ".txt", ".csv", ".arrow")
# what a target needs from a model repo (weights, config, tokenizer, chat template, remote code)
MODEL_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt", "*.jinja", "*.py"]


class HubError(ValueError):
    """A hub id (``org/name``) that cannot be resolved: it is not in the local Hugging Face cache and
    cannot be downloaded (HF_HUB_OFFLINE set, no network, no huggingface_hub). Fix: run the
    ``hf download`` command the message names, or pass a local directory."""


def is_hub_id(spec: str, dataset: bool = False) -> bool:
    """True when ``spec`` reads as a hub id (``org/name``, for a dataset optionally ``:split[slice]``)
    and is not an existing local path (a local ``org/name`` directory always wins)."""
    if Path(spec).expanduser().exists():
        return False
    repo, _, split = spec.partition(":") if dataset else (spec, "", "")
    if not _REPO_ID.fullmatch(repo) or repo.lower().endswith(_FILE_SUFFIXES):
        return False
    return not split or bool(_SPLIT.fullmatch(split))


def parse_dataset_id(spec: str) -> tuple[str, Optional[str]]:
    """``"org/name:train_sft[:200]"`` -> ``("org/name", "train_sft[:200]")``; no split -> None."""
    repo, _, split = spec.partition(":")
    return repo, (split or None)


def offline() -> bool:
    """``HF_HUB_OFFLINE`` as huggingface_hub reads it (1/ON/YES/TRUE), read now rather than at import."""
    value = os.environ.get("HF_HUB_OFFLINE")
    if value is not None:
        return value.strip().upper() in ("1", "ON", "YES", "TRUE")
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def hub_cache_dir() -> Path:
    """The hub cache huggingface_hub would use with the environment as it is now."""
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(key):
            return Path(os.environ[key]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def datasets_cache_dir() -> Path:
    """Where ``datasets`` keeps the Arrow files it converts a snapshot into (``HF_DATASETS_CACHE``,
    else ``HF_HOME/datasets``), read now rather than at import."""
    if os.environ.get("HF_DATASETS_CACHE"):
        return Path(os.environ["HF_DATASETS_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "datasets"
    from datasets import config

    return Path(config.HF_DATASETS_CACHE)


def fetch_command(repo_id: str, repo_type: str = "model") -> str:
    """The command that puts ``repo_id`` into the hub cache (huggingface_hub's ``hf`` CLI)."""
    return f"hf download {repo_id}" + (" --repo-type dataset" if repo_type == "dataset" else "")


def snapshot(repo_id: str, repo_type: str = "model", allow_patterns: Optional[list[str]] = None) -> Path:
    """The cached snapshot directory of ``repo_id``; downloaded first when missing and the network is on.

    Raises :class:`HubError` when it is not cached and ``HF_HUB_OFFLINE`` is set (or the download fails).
    """
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:  # pragma: no cover - a dependency of transformers
        raise HubError(f"'{repo_id}': reading a hub id needs huggingface_hub; pip install huggingface_hub") from None
    cache = hub_cache_dir()
    what = "dataset" if repo_type == "dataset" else "model"
    try:
        return Path(snapshot_download(repo_id, repo_type=repo_type, cache_dir=cache, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    if offline():
        raise HubError(f"hub {what} '{repo_id}' is not in the local Hugging Face cache ({cache}) and HF_HUB_OFFLINE "
                       f"is set (nor is it a local path); fetch it with `{fetch_command(repo_id, repo_type)}` (or unset "
                       f"HF_HUB_OFFLINE to download it on first use), or pass a local path")
    try:
        return Path(snapshot_download(repo_id, repo_type=repo_type, cache_dir=cache, allow_patterns=allow_patterns))
    except Exception as e:  # network, auth (gated repo), not found: one line, the id and the command
        detail = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise HubError(f"hub {what} '{repo_id}' is not cached ({cache}) and could not be downloaded ({detail}); "
                       f"check the id, then fetch it with `{fetch_command(repo_id, repo_type)}`") from None


def model_dir(repo_id: str) -> Path:
    """The local checkpoint directory of hub model ``repo_id`` (see :func:`snapshot`)."""
    return snapshot(repo_id, "model", allow_patterns=MODEL_PATTERNS)


def dataset_rows(spec: str) -> Iterator[dict]:
    """The rows of hub dataset ``spec`` (``org/name``, ``org/name:split[slice]``, ``org/name:config`` or
    ``org/name:config:split[slice]``).

    The snapshot, config and split are found (or the one-line error raised) now; the rows are read when
    iterated. Config: the named one, else the repo's only (or default) config; several and none named is
    an error listing them. Split: the named one, else ``train`` when the config has one, else its only
    split; several and none named train is an error listing them.
    """
    repo_id, rest = parse_dataset_id(spec)
    try:
        import datasets
    except ImportError:
        raise HubError(f"'{spec}': reading a hub dataset needs the datasets package; pip install datasets") from None
    root = snapshot(repo_id, "dataset")
    config, split = _config_and_split(spec, repo_id, root, rest)
    if split is None:
        split = _default_split(spec, root, config)

    def rows() -> Iterator[dict]:
        bars_were_on = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()  # one progress line per split is noise in a training log
        try:
            ds = datasets.load_dataset(str(root), name=config, split=split, cache_dir=str(datasets_cache_dir()))
        except (ValueError, KeyError, FileNotFoundError) as e:  # unknown split, bad slice, several configs
            raise HubError(f"hub dataset '{spec}': {str(e).strip().splitlines()[0][:240] if str(e).strip() else e!r}; "
                           f"name a split the repo has as '{repo_id}:<split>[<slice>]'") from None
        finally:
            if bars_were_on:
                datasets.enable_progress_bars()
        yield from ds

    return rows()


def _config_names(root: Path) -> list[str]:
    """The configs (subsets) a snapshot declares in its README (``configs:``); ``[]`` for a plain repo
    of data files, whose one config datasets calls ``default``."""
    from datasets import get_dataset_config_names

    try:
        names = list(get_dataset_config_names(str(root)))
    except Exception:  # no data files datasets recognises: load_dataset will say what it found
        return []
    return [] if names == ["default"] else names


def _config_and_split(spec: str, repo_id: str, root: Path, rest: Optional[str]) -> tuple[Optional[str], Optional[str]]:
    """``rest`` (what follows ``org/name:``) -> (config, split). ``config:split`` is explicit; a lone
    word is a config when the repo has several configs and it names one (``openai/gsm8k:main``), else
    a split. Several configs, none named and no default: a one-line error listing them."""
    configs = _config_names(root)
    # a colon before any `[` separates config from split (a slice has its own: `train[10%:]`)
    config, split = (rest.split(":", 1) if rest and ":" in rest.split("[", 1)[0] else (None, rest))
    if config is None and split is not None and len(configs) > 1 and split in configs:
        config, split = split, None
    if config is not None and config not in configs:
        have = f"its configs are {configs}" if configs else "it has no named configs"
        raise HubError(f"hub dataset '{spec}': no config '{config}' ({have}); "
                       f"use '{repo_id}:<split>[<slice>]'" + (f" or '{repo_id}:{configs[0]}:<split>'" if configs else ""))
    if config is None and len(configs) > 1:
        from datasets.inspect import get_dataset_default_config_name

        config = get_dataset_default_config_name(str(root))
        if config is None:
            raise HubError(f"hub dataset '{spec}' has configs {configs} and no default; name one as "
                           f"'{repo_id}:<config>[:<split>[<slice>]]', e.g. '{repo_id}:{configs[0]}'")
    return config, split


def _default_split(spec: str, root: Path, config: Optional[str] = None) -> str:
    """``train`` when the snapshot (the config's data files) has it, else its only split."""
    try:
        if config is None:
            from datasets.data_files import get_data_patterns

            splits = list(get_data_patterns(str(root)))
        else:
            from datasets import load_dataset_builder

            splits = [str(s) for s in load_dataset_builder(str(root), name=config).config.data_files or {}]
    except Exception:  # no data files datasets recognises: let load_dataset say what it found
        return "train"
    if "train" in splits or len(splits) != 1:
        if "train" not in splits:
            named = spec if config is None or spec.endswith(f":{config}") else f"{spec}:{config}"
            raise HubError(f"hub dataset '{spec}' has splits {sorted(splits)} and none is train; name one, "
                           f"e.g. '{named}:{sorted(splits)[0]}'")
        return "train"
    return splits[0]


__all__ = ["HubError", "is_hub_id", "parse_dataset_id", "offline", "hub_cache_dir", "datasets_cache_dir",
           "fetch_command", "snapshot", "model_dir", "dataset_rows", "MODEL_PATTERNS"]
