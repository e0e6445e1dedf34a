"""KV-cached EAGLE-3 inference reproduces the training-time-test unroll step for step."""

import pytest
import torch

from draftsmith.drafts.eagle3.config import Eagle3Config
from draftsmith.drafts.eagle3.model import Eagle3Draft
from draftsmith.drafts.eagle3.infer import extend, next_hidden
from draftsmith.drafts.layers import DraftKVCache

V, VD, H, HT = 50, 20, 32, 24


def make_draft(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(hidden_size=H, target_hidden_size=HT, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
               intermediate_size=48, vocab_size=V, draft_vocab_size=VD, num_aux=3, ttt_steps=3)
    cfg.update(kw)
    return Eagle3Draft(Eagle3Config(**cfg))


@pytest.mark.parametrize("variant", [{}, {"fc_norm": True, "norm_output": True}])
@torch.no_grad()
def test_chain_from_each_slot_equals_ttt_step(variant):
    d = make_draft(**variant).eval()
    g = torch.Generator().manual_seed(3)
    T = 7
    aux = torch.randn(1, T, 3, HT, generator=g) * 3
    ids = torch.randint(0, V, (1, T), generator=g)  # ids[t] = token_{t+1}, already shifted
    ttt = list(d.iter_steps(aux, ids, steps=3))
    for t in range(T - 2):
        cache = DraftKVCache()
        # target slots 0..t: (fc(aux_s), token_{s+1}) at position s
        step = extend(d, cache, d.combine(aux[:, : t + 1]), ids[:, : t + 1], torch.arange(t + 1)[None])
        torch.testing.assert_close(step.logits[:, -1], ttt[0].logits[:, t], atol=1e-5, rtol=1e-5)
        h = next_hidden(d, step)[:, -1:]
        for j in (1, 2):  # chain step j feeds token_{t+1+j} (teacher-forced) at position t + j
            step = extend(d, cache, h, ids[:, t + j : t + j + 1], torch.tensor([[t + j]]))
            torch.testing.assert_close(step.logits[:, -1], ttt[j].logits[:, t], atol=1e-5, rtol=1e-5,
                                       msg=f"slot {t} chain step {j}")
            h = next_hidden(d, step)
        assert len(cache) == t + 3


@torch.no_grad()
def test_incremental_prefill_and_rollback_equal_one_shot():
    d = make_draft(1).eval()
    g = torch.Generator().manual_seed(4)
    aux = torch.randn(1, 6, 3, HT, generator=g)
    ids = torch.randint(0, V, (1, 6), generator=g)
    pos = torch.arange(6)[None]
    one = extend(d, DraftKVCache(), d.combine(aux), ids, pos)
    cache = DraftKVCache()
    a = extend(d, cache, d.combine(aux[:, :2]), ids[:, :2], pos[:, :2])
    extend(d, cache, torch.randn(1, 2, H), ids[:, 2:4], pos[:, 2:4])  # stale chain slots...
    cache.crop(2)  # ...rolled back, then the real slots refilled
    b = extend(d, cache, d.combine(aux[:, 2:]), ids[:, 2:], pos[:, 2:])
    torch.testing.assert_close(torch.cat([a.logits, b.logits], 1), one.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat([a.hidden, b.hidden], 1), one.hidden, atol=1e-5, rtol=1e-5)
    assert len(cache) == 6
    with pytest.raises(ValueError, match="length=-1"):
        cache.crop(-1)
