"""The engines ``draftsmith regenerate`` answers with (:data:`draftsmith.data.regenerate.ENGINES`).

Each is a :class:`Generator`: one round of prompts in, the target's answers out, in order, every
request with its own seed (``seed + row * 1000 + turn``: a shard redone after a kill is identical).
``hf`` and ``vllm`` render the prompts here with the target's chat template (:class:`_Rendered`);
``url`` sends the messages to a running OpenAI-compatible server, which renders them itself.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from draftsmith import console
from draftsmith.data.regenerated import RegenError

if TYPE_CHECKING:
    from draftsmith.data.regenerate import RegenSettings


class Generator:
    """One round of generation: ``generate(conversations, seeds) -> [(text, new_tokens)]`` in order.
    ``on_answer(n)``, when set, is called as answers finish inside a round (the progress bar moves
    while a round of hundreds of requests runs, not only when it returns)."""

    name = "base"
    on_answer: Optional[Callable[[int], None]] = None

    def generate(self, conversations: list[list[dict]], seeds: list[int]) -> list[tuple[str, int]]:
        raise NotImplementedError

    def prompt_length(self, conversation: list[dict]) -> int:
        return 0

    def close(self) -> None:
        return None


class _Rendered(Generator):
    """Shared by the in-process engines: prompts rendered with the target's template and kwargs."""

    def __init__(self, target: str, s: RegenSettings):
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a weight-loading bar would bury our own progress
        self.target, self.s = target, s
        self.tokenizer = AutoTokenizer.from_pretrained(target, local_files_only=True)
        if not getattr(self.tokenizer, "chat_template", None):
            raise RegenError(f"--target {target}: its tokenizer has no chat template; regeneration renders prompts "
                             "with it, so use a chat (instruct) checkpoint")

    def prompt_ids(self, conversation: list[dict]) -> list[int]:
        # Render then tokenize without special tokens, exactly as training renders (data/template.py).
        text = self.tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False,
                                                  **self.s.chat_template_kwargs)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_length(self, conversation: list[dict]) -> int:
        return len(self.prompt_ids(conversation))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


class HFGenerator(_Rendered):
    """transformers ``generate``, one conversation at a time (no padding, so greedy is exact)."""

    name = "hf"

    def __init__(self, target: str, s: RegenSettings, dtype: str = "float32", device: str = "cpu"):
        import torch
        from transformers import AutoModelForCausalLM

        super().__init__(target, s)
        dt = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
        self.device = torch.device(device)
        model = AutoModelForCausalLM.from_pretrained(target, dtype=dt, local_files_only=True)
        self.model = model.to(self.device).eval()

    def generate(self, conversations: list[list[dict]], seeds: list[int]) -> list[tuple[str, int]]:
        import torch

        out = []
        for conv, seed in zip(conversations, seeds):
            ids = torch.tensor([self.prompt_ids(conv)], device=self.device)  # (1, T)
            sample = self.s.temperature > 0
            torch.manual_seed(seed)  # seeds the CUDA generators too: sampling on a GPU is seeded alike
            with torch.no_grad():
                gen = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=self.s.max_new_tokens,
                                          do_sample=sample, temperature=self.s.temperature if sample else None,
                                          top_p=self.s.top_p if sample else None, top_k=None)
            new = gen[0, ids.shape[1]:].tolist()
            eos = self.model.generation_config.eos_token_id
            eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
            if new and new[-1] in eos:
                new = new[:-1]
            out.append((self.decode(new), len(new)))
            if self.on_answer is not None:
                self.on_answer(1)
        return out


def cpu_sampling_kwargs(temperature: float, kwargs: dict, on_cpu: Optional[bool] = None) -> dict:
    """The engine settings sampled regeneration needs on vLLM's CPU backend, else ``{}``.

    Each request carries its own seed (a kill and rerun redoes a shard identically), so vLLM keeps a
    ``torch.Generator`` a request. When a step prefills only part of a prompt (chunked prefill: the
    step's token budget ran out) vLLM discards that step's sample and rewinds the generator with
    ``set_offset``, which only CUDA generators have: on the CPU the engine dies ("CPU Generator does not
    use offset", vllm 0.32; seen on the demo's 315 prompts at --temperature 0.8). With chunked prefill off
    every prompt is prefilled in one step, nothing is discarded, and no generator is rewound; the budget
    must then hold the longest prompt (max_model_len). Greedy requests draw nothing: unchanged."""
    if temperature <= 0:
        return {}
    if on_cpu is None:
        from vllm.platforms import current_platform

        on_cpu = current_platform.is_cpu()
    if not on_cpu:
        return {}
    budget = max(int(kwargs.get("max_num_batched_tokens") or 4096), int(kwargs["max_model_len"]))
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": budget}


class VLLMGenerator(_Rendered):
    """Offline ``vllm.LLM``: every prompt of a round is submitted at once (vLLM batches them)."""

    name = "vllm"

    def __init__(self, target: str, s: RegenSettings, dtype: str = "bfloat16", engine_kwargs: Optional[dict] = None):
        from draftsmith.targets.vllm import check_available

        check_available()
        super().__init__(target, s)
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
        from vllm import LLM

        kwargs = {"model": target, "dtype": dtype, "seed": s.seed, "max_model_len": s.max_prompt_tokens + s.max_new_tokens,
                  "enable_prefix_caching": True, **(engine_kwargs or {})}
        kwargs.update(cpu_sampling_kwargs(s.temperature, kwargs))
        self.llm = LLM(**kwargs)

    def generate(self, conversations: list[list[dict]], seeds: list[int]) -> list[tuple[str, int]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [SamplingParams(temperature=self.s.temperature, top_p=self.s.top_p, max_tokens=self.s.max_new_tokens,
                                 seed=seed, skip_special_tokens=True) for seed in seeds]
        # use_tqdm takes a tqdm factory: ours draws nothing and counts each finished request on our bar
        counter = functools.partial(console.Forwarding, on_update=self.on_answer) if self.on_answer else False
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=self.prompt_ids(c)) for c in conversations], params,
                                 use_tqdm=counter)
        # Decode the ids ourselves, as the hf engine does: vLLM's incremental detokenizer holds back a
        # trailing incomplete UTF-8 sequence, which would make the two engines' texts differ.
        return [(self.decode(o.outputs[0].token_ids), len(o.outputs[0].token_ids)) for o in outs]

    def close(self) -> None:
        self.llm = None


class URLGenerator(Generator):
    """A running OpenAI-compatible server; ``concurrency`` requests in flight, retried with backoff."""

    name = "url"

    def __init__(self, url: str, s: RegenSettings, model: Optional[str] = None, concurrency: int = 32,
                 retries: int = 3, timeout_s: float = 600.0):
        from draftsmith.httpjson import HttpClient

        self.url, self.s, self.concurrency = url.rstrip("/"), s, concurrency
        self.client = HttpClient(retries=retries, timeout_s=timeout_s, error=RegenError)
        self.model = model or self.client.get_json(self.url + "/v1/models")["data"][0]["id"]

    def _one(self, conversation: list[dict], seed: int) -> tuple[str, int]:
        body = {"model": self.model, "messages": conversation, "max_tokens": self.s.max_new_tokens,
                "temperature": self.s.temperature, "top_p": self.s.top_p, "seed": seed}
        if self.s.chat_template_kwargs:
            body["chat_template_kwargs"] = self.s.chat_template_kwargs  # top level, not extra_body
        reply = self.client.post_json(self.url + "/v1/chat/completions", body)
        if self.on_answer is not None:
            self.on_answer(1)
        try:
            text = reply["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise RegenError(f"--url {self.url}: a /v1/chat/completions reply has no choices[0].message.content "
                             f"({str(reply)[:120]}); is it an OpenAI-compatible server?") from None
        return text, int((reply.get("usage") or {}).get("completion_tokens", 0))

    def generate(self, conversations: list[list[dict]], seeds: list[int]) -> list[tuple[str, int]]:
        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            return list(pool.map(self._one, conversations, seeds))
