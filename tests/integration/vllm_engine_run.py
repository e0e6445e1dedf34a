"""hf vs vllm engine on tiny Llama and Qwen3 targets, plus one training run per engine.

Run as a script (vLLM spawns workers, so it needs the __main__ guard and its own process):
    python vllm_engine_run.py OUT_DIR
Writes OUT_DIR/{llama,qwen3}_{hf,vllm}.pt (features) and prints one line `RESULT {json}` with the
per-step training losses of both engines. One vLLM start per target plus one for both training runs.
"""

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/ (fixtures)

IDS = [4, 0, 1, 3, 6]  # request order on purpose unsorted; 0 = embeddings, 6 = L (pre-norm final)
AUX = [1, 3, 4]


def make_tiny_qwen3(path: Path, tok) -> Path:
    """A tiny random Qwen3 (q/k norms, tied embeddings, head_dim 32 for vLLM's CPU attention)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(1)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
                      rms_norm_eps=1e-6, tie_word_embeddings=True, pad_token_id=0, bos_token_id=None,
                      eos_token_id=tok.eos_token_id)
    from fixtures import save_peaked

    return save_peaked(Qwen3ForCausalLM(cfg).eval(), tok, path)


def batch_for(vocab: int):
    from draftsmith.targets import Batch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, vocab, (3, 40), generator=g)
    attn = torch.ones_like(ids)
    attn[1, 31:] = 0
    attn[2, 17:] = 0
    ids[attn == 0] = 0
    loss = torch.zeros_like(ids)
    loss[:, 8:35] = 1
    loss[attn == 0] = 0
    return Batch(ids, attn, loss)


def features(engine_name: str, target: Path, batch):
    from draftsmith.targets import open_engine

    eng = open_engine(engine_name, str(target), dtype="float32")
    try:
        t0 = time.time()
        f = eng.features(batch, IDS, logits=True)
        return {"aux": f.aux_hidden, "logits": f.logits, "s": time.time() - t0,
                "info": eng.info().to_dict(), "embed": eng.embeddings().clone()}
    finally:
        eng.close()


# P-EAGLE reads the same `eagle3` supervision, so the vllm engine must train it like hf does too.
DRAFTS = {"eagle3": {"ttt_steps": 2},
          "peagle": {"type": "peagle", "mask_token_id": 5, "num_depths": 3, "num_draft_layers": 2},
          # dflash_kd supervision: the aux ids plus the state at id L from the same vLLM engine
          "dspark": {"type": "dspark", "mask_token_id": 5, "block_size": 3, "num_draft_layers": 2, "num_anchors": 4,
                     "markov_rank": 8}}


class SharedVllm:
    """The trainer's ``open_engine``, but the vllm engine is opened once per (target, options) and kept
    open across training runs (close() at the end): the eagle3 and peagle runs read the same layers,
    so the second run reuses the first one's LLM (the runner rebuilds only for other layers) and saves
    a vLLM start. The hf engine opens as usual."""

    def __init__(self):
        import draftsmith.train.loop as loop

        self.loop, self.real, self.open = loop, loop.open_engine, {}
        loop.open_engine = self

    def __call__(self, name: str, target, **kwargs):
        if name != "vllm":
            return self.real(name, target, **kwargs)
        key = (str(target), json.dumps(kwargs, sort_keys=True, default=str))
        if key not in self.open:
            eng = self.real(name, target, **kwargs)
            self.open[key] = (eng, eng.close)
            eng.close = lambda: None  # the trainer's close at the end of its run: kept open for the next one
        return self.open[key][0]

    def close(self) -> None:
        self.loop.open_engine = self.real
        for _, close in self.open.values():
            close()


def train_losses(engine_name: str, target: Path, out: Path, family: str = "eagle3") -> list:
    from draftsmith.config import build_config
    from draftsmith.train.loop import train
    from fixtures import write_jsonl

    rows = [{"messages": [{"role": "user", "content": f"Tell me a joke about the number {i}."},
                          {"role": "assistant", "content": f"Why did {i} sit on the computer? To keep an eye on the mouse!"}]}
            for i in range(12)]
    data = write_jsonl(out / "chats.jsonl", rows)
    target_cfg = {"path": str(target), "aux_layer_ids": AUX, "engine": engine_name}
    if engine_name == "vllm":
        target_cfg["engine_kwargs"] = {"max_model_len": 128}
    cfg = build_config({
        "target": target_cfg,
        "data": {"sources": [str(data)], "max_length": 64, "eval_size": 2, "draft_vocab_size": 128},
        "draft": DRAFTS[family],
        "train": {"epochs": 2, "batch_size": 2, "lr": 1e-3},
        "output": {"dir": str(out / f"run_{engine_name}_{family}"), "tensorboard": False},
    })
    res = train(cfg, progress=False)
    return [float(l) for _, l in res.history]


def main():
    from fixtures import make_tiny_llama, make_tokenizer

    out = Path(sys.argv[1])
    tok = make_tokenizer("chatml")
    targets = {"llama": make_tiny_llama(out / "llama", tok, num_layers=6, hidden=64),
               "qwen3": make_tiny_qwen3(out / "qwen3", tok)}
    timing = {}
    for name, path in targets.items():
        batch = batch_for(len(tok))
        for eng in ("hf", "vllm"):
            f = features(eng, path, batch)
            timing[f"{name}_{eng}_s"] = f["s"]
            torch.save({**f, "batch": batch.__dict__}, out / f"{name}_{eng}.pt")
    shared = SharedVllm()
    try:
        losses = {fam: {eng: train_losses(eng, targets["llama"], out, fam) for eng in ("hf", "vllm")} for fam in DRAFTS}
    finally:
        shared.close()
    print("RESULT " + json.dumps({"losses": losses, "timing": timing}), flush=True)


if __name__ == "__main__":
    main()
