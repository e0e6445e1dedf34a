import pytest
import torch

from draftsmith.drafts.vocab import build_vocab_maps, coverage, select_draft_vocab, token_counts


def test_token_counts_only_counts_supervised_tokens():
    pairs = [([1, 2, 2, 3], [0, 1, 1, 1]), ([3, 3, 0], [1, 0, 1])]
    # supervised: 2, 2, 3 | 3, 0  ->  counts[0]=1, [2]=2, [3]=2
    assert token_counts(pairs, 5).tolist() == [1, 0, 2, 2, 0]
    with pytest.raises(ValueError, match="outside the target vocab of 3"):
        token_counts([([5], [1])], 3)


def test_selection_order_specials_first_then_count_then_lower_id():
    #                    id: 0  1  2  3  4  5  6  7
    counts = torch.tensor([0, 5, 9, 5, 1, 9, 0, 2])
    specials = [6, 0]
    # order: specials 0, 6; then counts desc with ties by id: 2(9), 5(9), 1(5), 3(5), 7(2), 4(1)
    assert select_draft_vocab(counts, specials, 2).tolist() == [0, 6]
    assert select_draft_vocab(counts, specials, 3).tolist() == [0, 2, 6]
    assert select_draft_vocab(counts, specials, 4).tolist() == [0, 2, 5, 6]
    assert select_draft_vocab(counts, specials, 5).tolist() == [0, 1, 2, 5, 6]  # 1 beats 3 on the tie
    assert select_draft_vocab(counts, specials, 7).tolist() == [0, 1, 2, 3, 5, 6, 7]
    assert select_draft_vocab(counts, specials, 8).tolist() == list(range(8))
    assert select_draft_vocab(counts, specials, 100).tolist() == list(range(8))
    # Special ids outside the vocab are ignored; without specials, ties go to the lower id.
    assert select_draft_vocab(counts, [99], 3).tolist() == [1, 2, 5]


def test_vocab_maps_round_trip():
    draft_ids = torch.tensor([0, 2, 5, 6, 9])
    d2t, t2d = build_vocab_maps(draft_ids, 12)
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool and t2d.shape == (12,)
    assert d2t.tolist() == [0, 1, 3, 3, 5]
    assert (torch.arange(5) + d2t).tolist() == draft_ids.tolist()  # target = draft + d2t[draft]
    assert t2d.nonzero().flatten().tolist() == draft_ids.tolist()
    with pytest.raises(ValueError, match="strictly increasing"):
        build_vocab_maps(torch.tensor([2, 1]), 12)
    with pytest.raises(ValueError, match=r"\[0, 12\)"):
        build_vocab_maps(torch.tensor([12]), 12)


def test_coverage_is_the_supervised_fraction():
    counts = torch.tensor([1, 0, 2, 2, 5])
    assert coverage(counts, torch.tensor([2, 4])) == pytest.approx(7 / 10)
    assert coverage(counts, torch.arange(5)) == 1.0
    assert coverage(torch.zeros(5, dtype=torch.long), torch.tensor([0])) == 0.0
