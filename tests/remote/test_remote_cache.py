"""`serve-target --engine cache --cache-dir DIR` serves a feature cache: a remote trainer gets the
supervision the co-located cache engine computes, bit for bit."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "cache"))

from cache_helpers import AUX, config, tiny_setup  # noqa: E402
from draftsmith.cache.build import build_cache  # noqa: E402
from draftsmith.data.dataset import collate  # noqa: E402
from draftsmith.inputs import render_examples  # noqa: E402
from draftsmith.remote.client import RemoteEngine  # noqa: E402
from draftsmith.targets import open_engine  # noqa: E402
from remote_helpers import ServerProc  # noqa: E402


def test_serve_target_serves_a_cache(tmp_path):
    from transformers import AutoTokenizer

    target, data = tiny_setup(tmp_path)
    cfg = config(target, data, tmp_path / "unused")
    build_cache(cfg, tmp_path / "cache", batch_size=2, progress=False, log=lambda s: None)
    rows, _, _ = render_examples(cfg, AutoTokenizer.from_pretrained(target))
    batches = [collate(rows[i : i + 2], 0) for i in range(0, 6, 2)]
    local = open_engine("cache", str(target), cache_dir=str(tmp_path / "cache"))
    server = ServerProc(target, extra=["--aux-layer-ids", *map(str, AUX), "--engine", "cache",
                                       "--cache-dir", str(tmp_path / "cache"), "--num-threads", "1"])
    try:
        draft_ids = torch.arange(0, 384, 3)
        local.set_vocab_map(draft_ids)
        with RemoteEngine(str(target), urls=[server.url]) as eng:
            eng.set_vocab_map(draft_ids)
            got = [s for _, s in eng.supervision("eagle3", iter(batches), AUX)]
        ref = [s for _, s in local.supervision("eagle3", iter(batches), AUX)]
        for g, r in zip(got, ref):
            assert torch.equal(g.aux_hidden, r.aux_hidden) and torch.equal(g.target_probs, r.target_probs)
            assert torch.equal(g.position_mask, r.position_mask)
    finally:
        server.kill()
