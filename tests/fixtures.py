"""Tiny tokenizers and targets built in code (no network, no downloads).

`make_tokenizer(template)` trains a byte-level BPE on a fixed corpus (deterministic, ~0.1 s) and
attaches a real chat template: "chatml" (SmolLM2/Qwen style) or "llama3" (Llama-3 style headers).
`make_tiny_llama(path, tokenizer)` saves a random tiny Llama (head_dim 32 so vLLM's CPU attention
accepts it) plus the tokenizer as an ordinary HF checkpoint directory.
"""

from __future__ import annotations

import json
from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

LLAMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

SPECIAL_TOKENS = [
    "<pad>",
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]

CORPUS = [
    "system user assistant",
    "You are a helpful assistant.",
    "What is the capital of France? The capital of France is Paris.",
    "Tell me a joke about cats. Why did the cat sit on the computer? To keep an eye on the mouse!",
    "How many legs does a spider have? A spider has eight legs.",
    "Write a haiku about the sea. Waves fold into foam, salt wind carries gull voices, the tide keeps its time.",
    "Explain recursion. A function that calls itself on a smaller input until a base case stops it.",
    "hello hi thanks bye yes no maybe one two three four five six seven eight nine ten",
    "the quick brown fox jumps over the lazy dog 0123456789 .,;:!?'\"()[]{}<>-+*/=_#@$%&|\\~`^",
] * 4


def make_tokenizer(template: str = "chatml", vocab_size: int = 384):
    """A deterministic byte-level BPE tokenizer with a real chat template attached."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    if template == "chatml":
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<pad>", bos_token="<|im_start|>"
        )
        fast.chat_template = CHATML_TEMPLATE
    elif template == "llama3":
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok, eos_token="<|eot_id|>", pad_token="<pad>", bos_token="<|begin_of_text|>"
        )
        fast.chat_template = LLAMA3_TEMPLATE
    else:
        raise ValueError(f"unknown template {template!r}")
    return fast


def tiny_llama_config(vocab_size: int, *, num_layers: int = 6, hidden: int = 64, tied: bool = False):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=hidden // 2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=tied,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )


def make_tiny_llama(path: str | Path, tokenizer=None, *, num_layers: int = 6, hidden: int = 64,
                    tied: bool = False, seed: int = 0) -> Path:
    """Save a random tiny Llama target (fp32) and its tokenizer under ``path``; return the path."""
    import torch
    from transformers import LlamaForCausalLM

    path = Path(path)
    tokenizer = tokenizer if tokenizer is not None else make_tokenizer("chatml")
    torch.manual_seed(seed)
    cfg = tiny_llama_config(len(tokenizer), num_layers=num_layers, hidden=hidden, tied=tied)
    cfg.eos_token_id = tokenizer.eos_token_id
    return save_peaked(LlamaForCausalLM(cfg).eval(), tokenizer, path)


def save_peaked(model, tokenizer, path: str | Path) -> Path:
    """Re-initialise a random tiny model's matrices wider than the default, save it with its tokenizer.

    Larger-than-default init gives the random target peaked, position-dependent predictions
    (a flat target gives a draft nothing to learn in a few steps).
    """
    import torch

    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return Path(path)


HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_snapshot(hub_dir: str | Path, kind: str, repo_id: str) -> Path:
    """``<hub_dir>/<kind>s--org--name/snapshots/<commit>/`` with ``refs/main`` naming it, the layout
    `hf download` leaves in the Hugging Face hub cache (``kind``: model or dataset); returns the snapshot dir."""
    repo = Path(hub_dir) / f"{kind}s--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(HUB_COMMIT)
    snap = repo / "snapshots" / HUB_COMMIT
    snap.mkdir(parents=True)
    return snap


def write_jsonl(path: str | Path, rows) -> Path:
    """Write ``rows`` (dicts) one JSON object per line, as chat data files are read."""
    path = Path(path)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


WORDS = ["cat", "dog", "sea", "fox", "spider", "France", "Paris", "mouse", "tide", "gull"]


def write_chats(path: str | Path, n: int = 16, numbered: bool = False) -> Path:
    """``n`` short one-turn chats about pairs of WORDS (``numbered``: each row made unique by its index)."""
    rows = []
    for i in range(n):
        a, b = WORDS[i % len(WORDS)], WORDS[(3 * i + 1) % len(WORDS)]
        tag = f", {i}" if numbered else ""
        tail = f" {i}" if numbered else ""
        rows.append({"messages": [{"role": "user", "content": f"Tell me about the {a} and the {b}{tag}."},
                                  {"role": "assistant", "content": f"The {a} is quick and the {b} is lazy{tail}."}]})
    return write_jsonl(path, rows)


def unsort_aux_ids(ckpt: str | Path, listed: list[int]) -> Path:
    """Rewrite a draftsmith EAGLE-3 / P-EAGLE checkpoint (trained on ascending aux ids) into the one the
    trainer wrote before it sorted them, trained on ``listed`` (the same ids in another order):
    config.json, meta.json and fc's input blocks (with mask_hidden, fc_norm.{i}, input_norm) in that
    order. The same draft exactly, so its served copy must reproduce the original's weights."""
    from safetensors.torch import load_file, save_file

    from draftsmith.serve.resolve import reorder_aux_blocks

    ckpt = Path(ckpt)
    cons = ckpt / "model" / "consolidated"
    cfg = json.loads((cons / "config.json").read_text())
    ascending = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert sorted(listed) == ascending == sorted(ascending), (listed, ascending)
    state = reorder_aux_blocks(load_file(str(cons / "model.safetensors")), [ascending.index(i) for i in listed])
    save_file({k: v.contiguous() for k, v in state.items()}, str(cons / "model.safetensors"))
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = list(listed)
    (cons / "config.json").write_text(json.dumps(cfg, indent=2))
    meta = json.loads((ckpt / "meta.json").read_text())
    (ckpt / "meta.json").write_text(json.dumps({**meta, "aux_layer_ids": list(listed)}, indent=2))
    return ckpt


def artifacts(d) -> list[Path]:
    """A cache / regenerate output dir's files, less the engine logs the CLI writes beside them
    (``engine.log``, ``engine.rank<r>.log``: what vLLM and transformers printed, which varies run to run)."""
    from draftsmith.console import is_engine_log

    return sorted(p for p in Path(d).iterdir() if not is_engine_log(p.name))
