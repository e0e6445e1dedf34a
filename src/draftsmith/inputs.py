"""What a run asks of the target: the rows rendered from ``data.*`` and the target layers read.

The trainer (train/loop.py) and ``draftsmith cache`` (cache/build.py) must agree on both -- a cache
holds exactly the rows and layer ids training will ask for -- so both sit above this module and take
them from here, rather than the cache reaching into the trainer. The trainer's train / held-out
split (:func:`split_rows`) and its engine options (:func:`engine_options`) are here too, beside
the rows they start from.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from draftsmith.config import ConfigError, RunConfig
from draftsmith.data.dataset import Example, build_examples, holdout_from_sources, split_holdout
from draftsmith.data.formats import DataError
from draftsmith.data.regenerated import template_kwargs_of
from draftsmith.data.sources import load_conversations
from draftsmith.drafts import get_family
from draftsmith.drafts.rope import rope_of_config, rope_problems, with_original_len
from draftsmith.targets.contract import ascending_layer_ids, default_layer_ids, validate_layer_ids


def resolve_template_kwargs(cfg: RunConfig) -> dict:
    """The chat-template kwargs to render with: ``data.chat_template_kwargs``, else those the
    ``draftsmith regenerate`` sources were made with (serving must use the same, so they are saved
    in the checkpoint's meta.json). A config that contradicts its regenerated data is refused."""
    made_with = template_kwargs_of(cfg.data.sources + cfg.data.eval_sources)  # the held-out rows render alike
    asked = cfg.data.chat_template_kwargs
    if asked is not None and made_with is not None and asked != made_with:
        raise ConfigError([f"'data.chat_template_kwargs' = {json.dumps(asked)} but data.sources were regenerated with "
                           f"{json.dumps(made_with)}; drop the key (the data's kwargs are used) or regenerate the data "
                           "with the kwargs you will serve with"])
    return dict(asked if asked is not None else made_with or {})


def check_target_rope(target: Union[Any, str, os.PathLike]) -> None:
    """Refuse a target whose RoPE a draft cannot copy (drafts/rope.py: the types vLLM serves for a draft
    and draftsmith trains), as a one-line ConfigError naming rope_type, its value and the supported ones.

    ``target``: a checkpoint dir, whose config.json is read before any engine loads the weights
    (transformers itself fails on an unknown rope_type, with a traceback; nothing is checked when there
    is no readable config.json), or a TargetInfo (what every engine reports), checked before the draft
    is built."""
    if isinstance(target, (str, os.PathLike)):
        path = Path(target) / "config.json"
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        text = config.get("text_config") or config
        heads, hidden = text.get("num_attention_heads"), text.get("hidden_size")
        head_dim = text.get("head_dim") or (hidden // heads if isinstance(hidden, int) and isinstance(heads, int)
                                            and heads > 0 else None)
        scaling, where = rope_of_config(config)[1], str(path)
    else:
        scaling = with_original_len(target.rope_scaling, target.max_position_embeddings)
        head_dim, where = target.head_dim, "the target's rope_parameters"
    problems = rope_problems(scaling, head_dim if isinstance(head_dim, int) else None, where=where)
    if problems:
        raise ConfigError(problems, source="target")


def aux_layer_ids(cfg: RunConfig, num_layers: int) -> list[int]:
    """The target layer ids the draft of ``cfg`` reads: target.aux_layer_ids or the family's default rule,
    in ascending order (:func:`aux_order_note` says when that reordered the user's list).

    Ascending because every engine serves them so (contract.ENGINE_ORDER_WHY: vLLM sorts the ids of
    EAGLE-3, P-EAGLE and DFlash drafts, SGLang captures in layer order): features, fc's input blocks,
    the cache, meta.json and the exported config all follow this one list. Shared with ``draftsmith
    cache`` (cache/build.py), so a cache holds exactly the ids training asks for.
    """
    family = get_family(cfg.draft.type)
    rule, count = family.layer_rule(cfg.draft)
    # a family that reads decoder-layer outputs (DFlash: on disk engine id - 1) refuses engine id 0
    first = family.first_layer_id
    return ascending_layer_ids(validate_layer_ids(cfg.target.aux_layer_ids or default_layer_ids(rule, num_layers, count),
                                                  num_layers, first=first))[0]


def aux_order_note(cfg: RunConfig) -> Optional[str]:
    """The one-line note for a ``target.aux_layer_ids`` that :func:`aux_layer_ids` reordered, else None."""
    return ascending_layer_ids(cfg.target.aux_layer_ids)[1] if cfg.target.aux_layer_ids else None


def render_examples(cfg: RunConfig, tokenizer: Any, held_out: bool = False) -> tuple[list[Example], Any, int]:
    """Conversations of ``data.*`` rendered as the trainer sees them: ``(examples, data report, dropped)``.

    One code path for training and ``draftsmith cache``, so cached rows are exactly the trainer's rows
    (before the train / held-out split; both parts ask the engine). ``held_out``: the rows of
    ``data.eval_sources`` instead (all of them: data.max_rows subsets the training sources only).
    """
    if held_out:
        try:
            convs, report = load_conversations(cfg.data.eval_sources, seed=cfg.train.seed)
        except DataError as e:
            raise DataError(f"data.eval_sources: {e}") from None
    else:
        convs, report = load_conversations(cfg.data.sources, max_rows=cfg.data.max_rows, seed=cfg.train.seed)
    examples, dropped = build_examples(convs, tokenizer, cfg.data.max_length, chat_template=cfg.data.chat_template,
                                       template_kwargs=resolve_template_kwargs(cfg))
    return examples, report, dropped


@dataclass
class Rows:
    """The trainer's rows: the train and held-out splits, the data report of ``data.sources``, the
    conversations dropped (no assistant token within data.max_length) and where the held-out came from."""

    train: list[Example]
    held_out: list[Example]
    report: Any
    dropped: int
    held_out_from: str


def split_rows(cfg: RunConfig, tokenizer: Any) -> Rows:
    """Conversations -> rendered examples -> train / held-out split: ``data.eval_sources`` when given
    (the metric then tracks text unlike the training rows), else ``data.eval_size`` of data.sources."""
    examples, report, dropped = render_examples(cfg, tokenizer)
    eval_size = cfg.data.eval_size  # a fraction below 1, a count from 1 up
    if cfg.data.eval_sources:
        held, _, held_dropped = render_examples(cfg, tokenizer, held_out=True)
        train, held_out, in_train = holdout_from_sources(examples, held)
        return Rows(train, held_out, report, dropped,
                    f"held-out from data.eval_sources {cfg.data.eval_sources}"
                    + (f", {in_train} also in data.sources left out" if in_train else "")
                    + (f", {held_dropped} without an assistant token dropped" if held_dropped else ""))
    train, held_out = split_holdout(examples, int(eval_size) if eval_size >= 1 else float(eval_size), cfg.train.seed)
    return Rows(train, held_out, report, dropped, f"held-out: data.eval_size={eval_size:g} of data.sources")


def engine_options(cfg: RunConfig) -> dict:
    """The :func:`draftsmith.targets.open_engine` keyword arguments ``target.*`` asks for besides the
    path, dtype and device: ``engine_kwargs`` (with ``tp_size`` folded in as the engine's own keyword),
    the remote engine's options (its draftsmith.remote.client.RemoteEngine arguments), the cache engine's dir,
    the hf engine's ``device_map``."""
    from draftsmith.targets import tp_engine_kwargs

    t = cfg.target
    kwargs = tp_engine_kwargs(t.engine, t.tp_size, t.engine_kwargs) if t.tp_size is not None else t.engine_kwargs
    options = {"engine_kwargs": kwargs} if kwargs else {}
    if t.engine == "remote":
        options.update(urls=t.remote_urls, prefetch_depth=t.prefetch_depth, timeout_s=t.remote_timeout_s,
                       retries=t.remote_retries, backoff_s=t.remote_backoff_s,
                       health_interval_s=t.remote_health_interval_s, auth_token_file=t.remote_auth_token_file,
                       data_plane=t.remote_data_plane)
    if t.engine == "cache":
        options["cache_dir"] = t.cache_dir
    if t.engine == "hf" and t.device_map is not None:  # only when set: the other engines take no such keyword
        options["device_map"] = t.device_map
    return options
