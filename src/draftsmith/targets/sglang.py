"""The sglang engine: features from SGLang's in-process model runner (CUDA only).

Targeted version: ``sglang==0.5.23`` (PyPI, CUDA builds only; SGLang has no CPU path from packages,
so this module is unit-tested here against a fake runner and exercised for real only where SGLang
and a GPU exist: tests/targets/test_sglang_engine.py skips otherwise). It uses SGLang internals that
move between releases (``sglang.bench_one_batch.load_model``, ``Req``, ``ScheduleBatch``,
``ForwardBatch``, ``CaptureHiddenMode``), the same ones SGLang's own one-batch benchmark drives;
everything version-coupled sits in :class:`SGLangRankRunner`.

Tensor parallelism (``tp_size`` > 1, from ``--tp-size`` / ``target.tp_size``): every TP rank runs, rank 0
here and the others in processes of their own (:func:`sglang_runner`, :class:`~draftsmith.targets.runner.TPRunner`).

Layer ids: SGLang's ``set_eagle3_layers_to_capture(ids)`` captures the INPUT of layer ``k + 1`` for
each ``k`` (``layers_to_capture = [k + 1 ...]``), i.e. the residual stream after ``k + 1`` layers, so
vLLM id ``i`` (0 < i < L) is SGLang id ``i - 1`` and vLLM id 0 (embeddings) is SGLang id ``-1``.
SGLang cannot capture after the last layer that way, so id ``L`` (pre-norm final state) is taken by a
forward pre-hook on the final norm, whose inputs are ``(x, residual)`` with pre-norm state
``x + residual``. Logits are rebuilt from id L like every runner engine
(:class:`~draftsmith.targets.runner.RunnerEngine`).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor

from draftsmith.targets.contract import TargetError
from draftsmith.targets.runner import Runner, RunnerEngine, TPRunner

SGLANG_VERSION = "0.5.23"
INSTALL_HINT = f"pip install 'sglang[all]=={SGLANG_VERSION}' (needs a CUDA GPU)"


def check_available() -> None:
    """Raise :class:`TargetError` (one line) when SGLang cannot run here: not installed, or no GPU."""
    if importlib.util.find_spec("sglang") is None:
        raise TargetError(f"target.engine: sglang is not installed; install it with `{INSTALL_HINT}`, or use target.engine: hf|vllm")
    if not torch.cuda.is_available():
        raise TargetError("target.engine: sglang needs a CUDA GPU and none is visible here; use target.engine: hf or vllm")


def sglang_capture_ids(layer_ids: Sequence[int], num_layers: int) -> list[int]:
    """vLLM-convention ids below L -> the ids SGLang's ``set_eagle3_layers_to_capture`` expects (``i - 1``)."""
    return [i - 1 for i in layer_ids if i < num_layers]


class _NoTreeCache:
    """The radix-cache stand-in ``ScheduleBatch`` needs when nothing is cached (as SGLang's one-batch bench)."""

    def __init__(self, mr):
        self.page_size = mr.server_args.page_size
        self.device = mr.device
        self.token_to_kv_pool_allocator = mr.token_to_kv_pool_allocator

    def supports_swa(self) -> bool:
        return False

    def supports_mamba(self) -> bool:
        return False

    def is_chunk_cache(self) -> bool:
        return False

    def is_tree_cache(self) -> bool:
        return True

    def evict(self, *args, **kwargs) -> None:
        return None


class SGLangRankRunner:
    """One TP rank of SGLang's ``ModelRunner`` (one extend per batch); rank 0's features are the engine's.

    With tensor parallelism every rank must run the same forward (their all-reduces meet), and the
    residual streams we capture are replicated after each layer's all-reduce, so rank 0's copy is whole.
    Radix cache and chunked prefill are off so each row's prefill computes every token.
    """

    def __init__(self, server_args: Any, port_args: Any, tp_rank: int, num_layers: int):
        from sglang.bench_one_batch import load_model

        self.server_args = server_args
        # SGLang's own placement rule for rank r: GPU base_gpu_id + r * gpu_id_step
        gpu_id = int(getattr(server_args, "base_gpu_id", 0) or 0) + tp_rank * int(getattr(server_args, "gpu_id_step", 1) or 1)
        loaded = load_model(server_args, port_args, gpu_id, tp_rank)
        self.mr = loaded[0] if isinstance(loaded, tuple) else loaded  # older releases also return a tokenizer
        self.num_layers = num_layers
        self.capture: list[int] = []
        self._pre_norm: Optional[Tensor] = None
        self._hook = self.mr.model.model.norm.register_forward_pre_hook(self._grab)

    def _grab(self, _module, args) -> None:
        # SGLang's fused RMSNorm is called as norm(x, residual): the pre-norm stream is x + residual.
        x = args[0]
        res = args[1] if len(args) > 1 else None
        self._pre_norm = x if res is None else x + res

    def set_capture_layers(self, layer_ids: Sequence[int]) -> None:
        self.capture = list(layer_ids)
        below = sglang_capture_ids(layer_ids, self.num_layers)
        if below:
            self.mr.model.set_eagle3_layers_to_capture(below)

    def run(self, rows: list[list[int]]) -> list[Tensor]:
        from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        params = SamplingParams(temperature=0.0, max_new_tokens=1)
        reqs = []
        for i, ids in enumerate(rows):
            req = Req(rid=str(i), origin_input_text="", origin_input_ids=list(ids), sampling_params=params)
            req.fill_ids = list(ids)
            req.logprob_start_len = -1
            if hasattr(req, "set_extend_input_len"):  # 0.5.x; earlier releases read the attribute
                req.set_extend_input_len(len(ids))
            else:
                req.extend_input_len = len(ids)
            reqs.append(req)
        batch = ScheduleBatch.init_new(
            reqs=reqs, req_to_token_pool=self.mr.req_to_token_pool,
            token_to_kv_pool_allocator=self.mr.token_to_kv_pool_allocator, tree_cache=_NoTreeCache(self.mr),
            model_config=self.mr.model_config, enable_overlap=False, spec_algorithm=SpeculativeAlgorithm.NONE,
        )
        batch.prepare_for_extend()
        fb = ForwardBatch.init_new(batch.get_model_worker_batch(), self.mr)
        fb.capture_hidden_mode = CaptureHiddenMode.FULL  # aux states for every token, not just the last
        try:
            out = self.mr.forward(fb)
            out = getattr(out, "logits_output", out)
            out = out[0] if isinstance(out, tuple) else out
            T, H = sum(len(r) for r in rows), self.mr.model_config.hidden_size
            parts = []
            below = [i for i in self.capture if i < self.num_layers]
            aux = out.hidden_states.view(T, len(below), H) if below else None  # (T, n_below*H) -> (T, n_below, H)
            for i in self.capture:  # ascending; id L is the last when present
                parts.append(aux[:, below.index(i)] if i < self.num_layers else self._pre_norm.view(T, H))
            flat = torch.stack(parts, dim=1).cpu()  # (T, n_capture, H), rows packed back to back
        finally:
            self.mr.req_to_token_pool.clear()
            self.mr.token_to_kv_pool_allocator.clear()
        return list(torch.split(flat, [len(r) for r in rows]))

    def close(self) -> None:
        self._hook.remove()
        self.mr = None


def _sglang_rank(tp_rank: int, server_args: Any, port_args: Any, num_layers: int) -> SGLangRankRunner:
    return SGLangRankRunner(server_args, port_args, tp_rank, num_layers)


def sglang_runner(path: Path, dtype: str, num_layers: int, engine_kwargs: Optional[dict] = None) -> TPRunner:
    """SGLang's ``ModelRunner`` on every TP rank (``engine_kwargs`` go to ``ServerArgs``, e.g. ``tp_size``).

    Rank 0 runs in this process and ranks 1..tp_size-1 in processes of their own (:class:`TPRunner`),
    the way SGLang's one-batch benchmark starts them, since loading rank 0 alone would wait forever for
    the others at the first collective.
    """
    from sglang.srt.server_args import PortArgs, ServerArgs

    args = dict(model_path=str(path), dtype=dtype, disable_radix_cache=True, disable_cuda_graph=True,
                chunked_prefill_size=-1, mem_fraction_static=0.5)
    args.update(engine_kwargs or {})
    server_args = ServerArgs(**args)
    port_args = PortArgs.init_new(server_args)
    tp = int(getattr(server_args, "tp_size", 1) or 1)
    return TPRunner(_sglang_rank, (server_args, port_args, num_layers), tp)


class SGLangEngine(RunnerEngine):
    """The :class:`~draftsmith.targets.Engine` contract over SGLang (features equal the hf engine's).

    ``target``: HF checkpoint directory or ``"smollm2"``; ``dtype``: float32 | bfloat16 | float16;
    ``engine_kwargs``: extra ``ServerArgs`` fields. ``runner``: any object following the
    :class:`~draftsmith.targets.runner.Runner` protocol (tests pass a fake; default: SGLang's).
    """

    def __init__(self, target: Union[str, os.PathLike], *, dtype: str = "float32", device: Optional[str] = None,
                 engine_kwargs: Optional[dict] = None, runner: Optional[Runner] = None):
        from draftsmith.models import resolve_target

        if runner is None:
            check_available()
        super().__init__(Path(resolve_target(target)), dtype)
        self.runner: Any = runner or sglang_runner(self.path, dtype, self._info.num_layers, engine_kwargs)
