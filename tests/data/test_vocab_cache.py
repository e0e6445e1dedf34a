import os

import pytest
import torch

import fixtures
from draftsmith.data import vocab_cache
from draftsmith.data.dataset import Example
from draftsmith.data.vocab_cache import VocabMap, cache_path, draft_vocab_for


def examples():
    # supervised ids: 10 x3, 11 x2, 12 x1, 13 x1 (id 14 is unsupervised)
    return [Example([14, 10, 10, 11], [0, 1, 1, 1]), Example([10, 11, 12, 13, 14], [1, 1, 1, 1, 0])]


def test_selection_coverage_and_cache_file(tmp_path):
    tok = fixtures.make_tokenizer("chatml")
    specials = sorted(tok.all_special_ids)  # [0, 2, 3]
    vm = draft_vocab_for(examples(), tok, vocab_size=384, draft_vocab_size=6, cache_dir=tmp_path)
    # specials first, then 10 (3), 11 (2), 12 (1 beats 13 on the tie)
    assert vm.draft_ids.tolist() == sorted(specials + [10, 11, 12])
    assert (torch.arange(6) + vm.d2t).tolist() == vm.draft_ids.tolist()
    assert vm.t2d.nonzero().flatten().tolist() == vm.draft_ids.tolist()
    assert vm.coverage == pytest.approx(6 / 7)
    path = cache_path(tmp_path, vm.fingerprint)
    assert path.name == f"vocab_{vm.fingerprint[:16]}.safetensors" and path.is_file()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left behind


def test_cache_hit_reuses_the_file_without_selecting(tmp_path, monkeypatch):
    tok = fixtures.make_tokenizer("chatml")
    first = draft_vocab_for(examples(), tok, 384, 6, tmp_path)
    path = cache_path(tmp_path, first.fingerprint)
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))

    def boom(*args, **kwargs):
        raise AssertionError("selection ran on a cache hit")

    monkeypatch.setattr(vocab_cache.vocab_math, "select_draft_vocab", boom)
    again = draft_vocab_for(examples(), tok, 384, 6, tmp_path)
    assert path.stat().st_mtime_ns == 1_000_000_000
    assert again.draft_ids.tolist() == first.draft_ids.tolist()
    assert again.d2t.tolist() == first.d2t.tolist() and again.t2d.tolist() == first.t2d.tolist()
    assert again.coverage == first.coverage and again.fingerprint == first.fingerprint


def test_changed_inputs_change_the_fingerprint_and_rebuild(tmp_path):
    tok = fixtures.make_tokenizer("chatml")
    base = draft_vocab_for(examples(), tok, 384, 6, tmp_path)
    changed = examples()
    changed[1].loss_mask[4] = 1  # id 14 becomes supervised
    changed[1].input_ids[2] = 14  # ... and 12 disappears
    vm = draft_vocab_for(changed, tok, 384, 6, tmp_path)
    assert vm.fingerprint != base.fingerprint
    assert 14 in vm.draft_ids.tolist() and 12 not in vm.draft_ids.tolist()
    assert len(list(tmp_path.iterdir())) == 2
    # The sizes and the tokenizer are part of the fingerprint too.
    assert draft_vocab_for(examples(), tok, 384, 7, None).fingerprint != base.fingerprint
    assert draft_vocab_for(examples(), tok, 400, 6, None).fingerprint != base.fingerprint
    other = fixtures.make_tokenizer("llama3")
    assert draft_vocab_for(examples(), other, 384, 6, None).fingerprint != base.fingerprint


def test_corrupt_cache_file_is_rebuilt(tmp_path):
    tok = fixtures.make_tokenizer("chatml")
    vm = draft_vocab_for(examples(), tok, 384, 6, tmp_path)
    cache_path(tmp_path, vm.fingerprint).write_bytes(b"garbage")
    again = draft_vocab_for(examples(), tok, 384, 6, tmp_path)
    assert again.draft_ids.tolist() == vm.draft_ids.tolist()
    assert VocabMap.from_tensors(again.to_tensors()).coverage == vm.coverage


def test_to_from_tensors_round_trip():
    vm = VocabMap(torch.tensor([0, 3]), torch.tensor([0, 2]), torch.tensor([True, False, False, True]), 0.75, "ab12")
    tensors = vm.to_tensors()
    assert all(isinstance(t, torch.Tensor) for t in tensors.values())
    back = VocabMap.from_tensors(tensors)
    assert back.draft_ids.tolist() == [0, 3] and back.d2t.tolist() == [0, 2]
    assert back.t2d.tolist() == [True, False, False, True]
    assert back.coverage == 0.75 and back.fingerprint == "ab12"
