"""data.eval_sources: the held-out split comes from other sources (all of data.sources train, data.eval_size is
ignored), rows also in training are left out, the setup line says where the split came from, and the
feature cache holds the held-out rows too."""

from __future__ import annotations

import json

import pytest

from draftsmith.config import ConfigError, build_config
from draftsmith.data.dataset import Example, holdout_from_sources
from draftsmith.data.formats import DataError
from fixtures import make_tiny_llama, make_tokenizer, write_jsonl


def chats(path, subject: str, n: int):
    return write_jsonl(path, [{"messages": [
        {"role": "user", "content": f"Tell me about the {subject} number {i}."},
        {"role": "assistant", "content": f"The {subject} {i} is quick and the {subject} is lazy."}]} for i in range(n)])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_sources")
    target = make_tiny_llama(root / "target", make_tokenizer("chatml"), num_layers=4, hidden=64)
    train = chats(root / "train.jsonl", "cat", 10)
    # the held-out source: 4 rows of its own plus one that is also a training row
    first = json.loads((root / "train.jsonl").read_text().splitlines()[0])
    held = write_jsonl(root / "held.jsonl", [first] + [{"messages": [
        {"role": "user", "content": f"And the sea {i}?"}, {"role": "assistant", "content": f"The sea {i} is wide."}]}
        for i in range(4)])
    return target, train, held


def config(target, train, held, out, **data):
    return build_config({
        "target": {"path": str(target), "aux_layer_ids": [1, 2, 3]},
        "data": {"sources": [str(train)], "eval_sources": [str(held)], "max_length": 64, "eval_size": 3,
                 "draft_vocab_size": 96, **data},
        "draft": {"ttt_steps": 2},
        "train": {"epochs": 1, "batch_size": 2, "log_every": 1},
        "output": {"dir": str(out), "tensorboard": False},
    })


def test_split_keeps_every_training_row_and_drops_held_rows_seen_in_training():
    a, b, c = Example([1, 2], [0, 1]), Example([3, 4], [0, 1]), Example([5, 6], [0, 1])
    train, held, in_train = holdout_from_sources([a, b], [b, c])
    assert train == [a, b] and held == [c] and in_train == 1
    with pytest.raises(DataError, match="all 1 held-out conversations are also in data.sources"):
        holdout_from_sources([a], [a])


def test_config_key_is_a_list_of_sources_defaulting_to_none():
    assert build_config({}).data.eval_sources == []
    with pytest.raises(ConfigError, match="'data.eval_sources' = 'held.jsonl': expected list"):
        build_config({"data": {"eval_sources": "held.jsonl"}})


def test_trainer_holds_out_the_eval_sources_only_and_says_so(tiny, tmp_path):
    from draftsmith.train.loop import Trainer

    target, train, held = tiny
    trainer = Trainer(config(target, train, held, tmp_path / "run"), progress=False)
    assert len(trainer.train_set) == 10 and len(trainer.eval_set) == 4  # eval_size 3 is ignored
    text = [trainer.tokenizer.decode(ex.input_ids) for ex in trainer.eval_set]
    assert all("sea" in t and "cat" not in t for t in text)
    setup = next(line for line in trainer.describe() if line.startswith("setup:"))
    assert f"held-out from data.eval_sources ['{held}'], 1 also in data.sources left out" in setup
    plain = Trainer(config(target, train, held, tmp_path / "plain", eval_sources=[]), progress=False)
    assert (len(plain.train_set), len(plain.eval_set)) == (7, 3)
    assert "held-out: data.eval_size=3 of data.sources" in next(l for l in plain.describe() if l.startswith("setup:"))


def test_a_missing_eval_source_fails_before_the_target_loads(tiny, tmp_path):
    from draftsmith.train.loop import Trainer

    target, train, _ = tiny
    with pytest.raises(DataError, match="'nope.jsonl' does not exist"):
        Trainer(config(target, train, "nope.jsonl", tmp_path / "run"), progress=False)


def test_cache_holds_the_held_out_rows_too(tiny, tmp_path):
    from draftsmith.cache.build import build_cache
    from draftsmith.cache.store import CacheReader, row_key
    from draftsmith.train.loop import Trainer

    target, train, held = tiny
    cfg = config(target, train, held, tmp_path / "run")
    m = build_cache(cfg, tmp_path / "cache", engine="hf", batch_size=4, shard_rows=8, progress=False, log=lambda s: None)
    assert m["data"]["rows"] == 14  # 10 train + 5 held - the one both hold
    trainer = Trainer(cfg, progress=False)
    reader = CacheReader(tmp_path / "cache")
    assert all(row_key(ex.input_ids) in reader for ex in trainer.train_set + trainer.eval_set)
    reader.close()
