import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import draftsmith
import fixtures
from draftsmith.data.dataset import Example, build_examples, collate, epoch_order, length_grouped, split_holdout
from draftsmith.data.formats import DataError
from draftsmith.data.template import render


def convs():
    return [
        [{"role": "user", "content": "What is the capital of France?"},
         {"role": "assistant", "content": "The capital of France is Paris."}],
        [{"role": "system", "content": "You are a helpful assistant."},
         {"role": "user", "content": "Explain recursion. " * 5},
         {"role": "assistant", "content": "A function that calls itself."}],
    ]


def test_build_examples_drops_examples_truncated_before_any_assistant_token():
    tok = fixtures.make_tokenizer("chatml")
    c = convs()
    first_ids, first_mask = render(c[0], tok, None)
    second_ids, second_mask = render(c[1], tok, None)
    cut = second_mask.index(1)  # the second conversation's first assistant token lies past `cut`
    assert first_mask.index(1) < cut
    examples, dropped = build_examples(c, tok, max_length=cut)
    assert dropped == 1
    assert examples == [Example(first_ids[:cut], first_mask[:cut])]
    examples, dropped = build_examples(c, tok, max_length=None)
    assert dropped == 0 and [e.input_ids for e in examples] == [first_ids, second_ids]


def ex(i):
    return Example([i], [1])


def test_split_holdout_fraction_and_count_are_deterministic():
    data = [ex(i) for i in range(20)]
    train, held = split_holdout(data, 0.25, seed=1)
    assert len(held) == 5 and len(train) == 15
    assert sorted(e.input_ids[0] for e in train + held) == list(range(20))
    ids = [e.input_ids[0] for e in held]
    assert ids == sorted(ids)  # input order kept
    assert split_holdout(data, 0.25, seed=1) == (train, held)
    assert split_holdout(data, 0.25, seed=2)[1] != held
    train, held = split_holdout(data, 3, seed=0)
    assert (len(train), len(held)) == (17, 3)
    assert split_holdout(data, 0, seed=0) == (data, [])
    assert len(split_holdout(data, 0.001, seed=0)[1]) == 1  # a positive fraction holds out at least one


@pytest.mark.parametrize("size", [1, 5, 0.99, 1.0, -1, "0.1"])
def test_split_holdout_rejects_sizes_that_leave_no_training_data(size):
    with pytest.raises(DataError, match="data.eval_size"):
        split_holdout([ex(0)], size, seed=0)


def test_epoch_order_depends_only_on_seed_and_epoch():
    a = epoch_order(10, epoch=0, seed=7)
    assert sorted(a) == list(range(10))
    assert a == epoch_order(10, epoch=0, seed=7)
    assert a != epoch_order(10, epoch=1, seed=7)
    assert a != epoch_order(10, epoch=0, seed=8)
    g = torch.Generator()
    g.manual_seed((7 * 0x9E3779B97F4A7C15 + 0) % (1 << 63))
    assert a == torch.randperm(10, generator=g).tolist()


def test_collate_right_pads_int64():
    batch = collate([Example([5, 6, 7], [0, 1, 1]), Example([8], [1])], pad_id=0)
    assert batch.input_ids.dtype == batch.attention_mask.dtype == batch.loss_mask.dtype == torch.int64
    assert batch.input_ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch.loss_mask.tolist() == [[0, 1, 1], [1, 0, 0]]


def test_importing_the_dataset_module_does_not_import_vllm():
    code = "import sys, draftsmith.data.dataset; assert 'vllm' not in sys.modules; assert 'transformers' not in sys.modules"
    src = str(Path(draftsmith.__file__).parents[1])  # works for both `PYTHONPATH=src` and installs
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_length_grouping_sorts_within_spans_and_keeps_the_shuffle_across_them():
    lengths = [5, 1, 9, 3, 7, 2, 8, 4, 6, 10]
    order = [3, 0, 9, 5, 1, 8, 2, 7, 6, 4]
    # batch 2, window 2 -> spans of 4: [3,0,9,5] [1,8,2,7] [6,4], each longest first
    assert length_grouped(order, lengths, batch_size=2, window=2) == [9, 0, 3, 5, 2, 8, 7, 1, 6, 4]
    got = length_grouped(order, lengths, batch_size=2, window=2)
    assert sorted(got) == sorted(order)
    pad = lambda o: sum(max(lengths[i] for i in o[k:k + 2]) * 2 - sum(lengths[i] for i in o[k:k + 2])
                        for k in range(0, len(o), 2))
    assert pad(got) < pad(order)  # padded slots: (5,1,3,3,1) vs (2,8,5,5,1)
    assert pad(got) == 13 and pad(order) == 21
