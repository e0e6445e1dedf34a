"""A small runner protocol and the one adapter that turns any runner into an engine.

Inference engines (vLLM, SGLang) differ only in how they build the model, choose which residual
streams to capture, run a batch and read the embedding. A :class:`Runner` isolates exactly those
calls; :class:`RunnerEngine` does everything else once, for every such engine:

* layer-id validation and request order (runners capture a sorted set of ids),
* per-row trimming of right padding (one prefill per real row) and re-padding to (B, S),
* full-vocab logits rebuilt in-process from layer id L (pre-norm) with the target's final RMSNorm
  and lm_head read straight from the checkpoint's safetensors (tied targets use ``embed_tokens``),
* :class:`~draftsmith.targets.TargetInfo` from the checkpoint's ``config.json``.

So an engine module is a thin adapter: it implements a runner and subclasses :class:`RunnerEngine`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional, Protocol, Sequence

import torch
from torch import Tensor

from draftsmith.targets import Batch, ColocatedEngine, Features, TargetInfo
from draftsmith.targets.contract import TargetError, rebuild_logits, validate_layer_ids

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Runner(Protocol):
    """The engine-internal calls an inference engine must provide (nothing else is engine-specific).

    ``set_capture_layers(ids)`` receives sorted, distinct vLLM-convention ids (may rebuild the model);
    ``run(rows)`` takes one token list per row and returns, per row, a (T_row, n_ids, H) tensor of
    the residual streams at those ids in that (sorted) order; ``close()`` frees the engine.
    """

    def set_capture_layers(self, layer_ids: Sequence[int]) -> None: ...

    def run(self, rows: list[list[int]]) -> list[Tensor]: ...

    def close(self) -> None: ...


class CheckpointWeights:
    """Reads single tensors (final norm, lm_head, embeddings) from a HF safetensors checkpoint.

    Handles one ``model.safetensors`` or sharded checkpoints with ``model.safetensors.index.json``;
    only the requested tensors are loaded (safetensors maps the file, so a 70B target costs V x H).
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        index = self.path / "model.safetensors.index.json"
        if index.is_file():
            self.where = {k: self.path / f for k, f in json.loads(index.read_text())["weight_map"].items()}
        else:
            files = sorted(self.path.glob("*.safetensors"))
            if not files:
                raise TargetError(
                    f"target.path: no *.safetensors in {self.path}; this engine reads the final norm and "
                    f"lm_head from safetensors, so re-save the target with save_pretrained(safe_serialization=True)"
                )
            from safetensors import safe_open

            self.where = {}
            for f in files:
                with safe_open(str(f), framework="pt") as sf:
                    self.where.update({k: f for k in sf.keys()})

    def find(self, *suffixes: str) -> Optional[str]:
        """The first key equal to or ending in ``.<suffix>`` (``model.norm.weight``, ``lm_head.weight``)."""
        for s in suffixes:
            for k in self.where:
                if k == s or k.endswith("." + s):
                    return k
        return None

    def get(self, key: str) -> Tensor:
        from safetensors import safe_open

        with safe_open(str(self.where[key]), framework="pt") as sf:
            return sf.get_tensor(key)


# One decoder layer's tensors under Llama's names (Qwen3 and Gemma 3 add q_norm/k_norm; Mistral, Qwen2, Granite,
# GPT-OSS use the same names; an MoE layer has no dense mlp.*). The first five are what any attention layer has.
LAYER_TENSORS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                 "self_attn.o_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
                 "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                 "self_attn.q_norm.weight", "self_attn.k_norm.weight")
# Phi-3 stores fused projections: qkv_proj = [q; k; v] rows, gate_up_proj = [gate; up] rows
FUSED = {"self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
         "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")}


def decoder_layer_weights(path: Path, index: int, info: TargetInfo) -> dict[str, Tensor]:
    """Target decoder layer ``index`` (negative counts from the end) read from the checkpoint at ``path``:
    {name in :data:`LAYER_TENSORS` -> fp32 tensor} for the names it has (fused Phi-3 projections split).
    Norm weights come back as the plain RMSNorm's, ``w + info.norm_offset`` (Gemma's ``(1 + w)`` norms).
    A TargetError names the key and the fix when the index is out of range or the layer has no attention
    projections under these names (MLA: DeepSeek-V3)."""
    n = info.num_layers
    i = index + n if index < 0 else index
    if not 0 <= i < n:
        raise TargetError(f"draft.init_layer_from_target: {index} is not a decoder layer of this target "
                          f"({n} layers: 0..{n - 1}, or -1..-{n} from the end)")
    weights = CheckpointWeights(path)
    out: dict[str, Tensor] = {}
    for name in (*LAYER_TENSORS, *FUSED):
        key = weights.find(f"layers.{i}.{name}")
        if key is None:
            continue
        w = weights.get(key).float()
        if name in FUSED:  # split along the output rows: q (h*d), k and v (h_kv*d); gate and up (I each)
            q, kv = info.num_attention_heads * info.head_dim, info.num_key_value_heads * info.head_dim
            sizes = [q, kv, kv] if len(FUSED[name]) == 3 else [w.shape[0] // 2] * 2
            out.update(zip(FUSED[name], w.split(sizes)))
        else:
            out[name] = w + info.norm_offset if name.endswith("norm.weight") else w
    missing = [m for m in LAYER_TENSORS[:5] if m not in out]
    if missing:
        raise TargetError(f"draft.init_layer_from_target: layer {i} of {path} has no {', '.join(missing)} "
                          f"(model.layers.{i}.* under Llama's names; {info.model_type} attention is not that shape); "
                          f"set draft.init_layer_from_target: null")
    return out


def target_info(path: Path, dtype: str, tied: bool) -> TargetInfo:
    """:class:`TargetInfo` from ``config.json`` (same fields the hf engine reports)."""
    from transformers import AutoConfig

    from draftsmith.targets.hf import info_from_config

    return info_from_config(AutoConfig.from_pretrained(path, local_files_only=True).get_text_config(),
                            dtype=dtype, tied=tied)


class RunnerEngine(ColocatedEngine):
    """An :class:`~draftsmith.targets.Engine` over any :class:`Runner` (subclasses set ``self.runner``).

    ``path`` is a HF checkpoint directory, ``dtype`` the dtype the runner computes in. Features equal
    the hf engine's: aux (B, S, n, H) in request order, logits (B, S, V) rebuilt from id L.
    """

    runner: Runner

    def __init__(self, path: Path, dtype: str):
        if dtype not in DTYPES:
            raise TargetError(f"target.dtype: {dtype!r} is not supported; use one of {sorted(DTYPES)}")
        self.path, self.dtype = Path(path), dtype
        self.weights = CheckpointWeights(self.path)
        self._embed_key = self.weights.find("embed_tokens.weight", "wte.weight")
        head_key = self.weights.find("lm_head.weight")
        self._norm_key = self.weights.find("model.norm.weight", "norm.weight")
        if self._embed_key is None or self._norm_key is None:
            raise TargetError(
                f"target.path: {self.path} has no embed_tokens/final norm weights in its safetensors; "
                f"this engine supports Llama-style targets (model.embed_tokens, model.norm), use target.engine: hf"
            )
        self._head_key = head_key or self._embed_key  # tied targets store only embed_tokens
        self._info = target_info(self.path, dtype, tied=head_key is None)
        self._capture: Optional[list[int]] = None
        self._cache: dict[str, Tensor] = {}

    # ------------------------------------------------------------------ weights
    def _weight(self, key: str) -> Tensor:
        if key not in self._cache:
            self._cache[key] = self.weights.get(key).to(DTYPES[self.dtype])
        return self._cache[key]

    def info(self) -> TargetInfo:
        return self._info

    def embeddings(self) -> Tensor:
        """(V, H) input embedding read from the checkpoint."""
        return self._weight(self._embed_key)

    def lm_head_weight(self) -> Tensor:
        """(V, H) output projection (``embed_tokens`` when the target is tied)."""
        return self._weight(self._head_key)

    def final_norm_weight(self) -> Tensor:
        """(H,) final RMSNorm weight (applied to layer id L before the lm_head)."""
        return self._weight(self._norm_key)

    # ------------------------------------------------------------------ features
    def features(self, batch: Batch, layer_ids: Sequence[int], *, logits: bool) -> Features:
        """One prefill per row; aux (B, S, n, H) in request order, logits (B, S, V) or None.

        Pad positions (attention_mask 0, right padding) hold zeros: no prefill ran there. Their
        logits are zero too, so softmax there is uniform; every supervision mask is 0 on them.
        """
        L = self._info.num_layers
        ids = validate_layer_ids(layer_ids, L)
        capture = sorted(set(ids) | ({L} if logits else set()))
        if capture != self._capture:
            self.runner.set_capture_layers(capture)
            self._capture = capture
        lengths = batch.attention_mask.sum(dim=1).tolist()
        live = [b for b, n in enumerate(lengths) if n > 0]  # all-pad rows have nothing to prefill
        rows = [batch.input_ids[b, : int(lengths[b])].tolist() for b in live]
        states = self.runner.run(rows) if rows else []  # len(live) x (T_b, len(capture), H)
        B, S = batch.input_ids.shape
        H = self._info.hidden_size
        full = torch.zeros(B, S, len(capture), H, dtype=DTYPES[self.dtype])
        for b, h in zip(live, states):
            n = lengths[b]
            if h.shape[0] != n or h.shape[1:] != (len(capture), H):
                raise TargetError(
                    f"target.engine: row {b} came back as {tuple(h.shape)}, expected ({n}, {len(capture)}, {H}); "
                    f"the engine's capture output does not match its request (version mismatch?)"
                )
            full[b, :n] = h.to(full.dtype)
        pick = torch.tensor([capture.index(i) for i in ids])
        aux = full.index_select(2, pick)  # (B, S, |capture|, H) -> (B, S, n, H) in request order
        out_logits = None
        if logits:
            h_last = full[:, :, capture.index(L)]  # (B, S, H) pre-norm residual stream at id L
            out_logits = rebuild_logits(h_last, self.final_norm_weight(), self.lm_head_weight(),
                                        self._info.rms_norm_eps, self._info.head_form())
            out_logits[batch.attention_mask == 0] = 0
        return Features(aux_hidden=aux, logits=out_logits)

    def close(self) -> None:
        """Stop the runner; the engine is unusable afterwards."""
        runner = getattr(self, "runner", None)
        if runner is not None:
            runner.close()
            self.runner = None  # type: ignore[assignment]
        self._cache.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _rank_main(factory, args: tuple, rank: int, conn) -> None:
    """A TP rank's process: build its runner, then run what rank 0 sends until ``close``.

    Replies ``("ok", None)`` or ``("error", "Type: message")`` to each command; the features a rank
    computes stay here (rank 0's are the engine's), so nothing but a status crosses the pipe.
    """
    try:
        runner = factory(rank, *args)
    except BaseException as e:  # noqa: BLE001 -- reported to rank 0, which raises it by rank
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ok", None))
    while True:
        op, payload = conn.recv()
        try:
            if op == "close":
                runner.close()
                conn.send(("ok", None))
                return
            getattr(runner, op)(payload)  # set_capture_layers(ids) | run(rows)
            conn.send(("ok", None))
        except BaseException as e:  # noqa: BLE001
            conn.send(("error", f"{type(e).__name__}: {e}"))


class TPRunner:
    """A :class:`Runner` over every tensor-parallel rank of an engine that is driven rank by rank (SGLang).

    ``factory(rank, *args)`` builds one rank's runner: rank 0 in this process, ranks 1..tp_size-1 each in a
    process of its own (spawned, so CUDA can start there). Every command goes to every rank, since a TP
    forward's all-reduces need all of them; features come from rank 0, whose residual streams are whole
    after each all-reduce. A rank that fails to build or to run is raised here as a one-line
    :class:`TargetError` naming the rank, instead of leaving rank 0 waiting at a collective.
    """

    def __init__(self, factory, args: tuple, tp_size: int, *, start_timeout_s: float = 1800.0):
        import multiprocessing as mp
        import threading

        self.tp_size, self.procs, self.conns = int(tp_size), [], []
        ctx = mp.get_context("spawn")
        for rank in range(1, self.tp_size):  # the others first: rank 0's load waits for them at its first collective
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_rank_main, args=(factory, args, rank, child), daemon=True, name=f"tp-rank-{rank}")
            p.start()
            self.procs.append(p)
            self.conns.append(parent)
        built: dict = {}

        def build_rank0():
            try:
                built["runner"] = factory(0, *args)
            except BaseException as e:  # noqa: BLE001
                built["error"] = e

        t = threading.Thread(target=build_rank0, daemon=True, name="tp-rank-0")
        t.start()
        pending, deadline = set(range(1, self.tp_size)), time.monotonic() + start_timeout_s
        try:
            while (t.is_alive() or pending) and "error" not in built:  # a failing rank stops the wait at once
                for rank in sorted(pending):
                    if self.conns[rank - 1].poll():
                        self._check(rank, self.conns[rank - 1].recv())
                        pending.discard(rank)
                    elif not self.procs[rank - 1].is_alive():
                        raise TargetError(f"target.engine: TP rank {rank} of {self.tp_size} exited (code "
                                          f"{self.procs[rank - 1].exitcode}) while loading; see its output above")
                if time.monotonic() > deadline:
                    raise TargetError(f"target.engine: the {self.tp_size} TP ranks did not all load within "
                                      f"{start_timeout_s:.0f} s (ranks still loading: {sorted(pending) or [0]})")
                t.join(0.05)
            if "error" in built:
                raise TargetError(f"target.engine: TP rank 0 of {self.tp_size} failed to load: "
                                  f"{type(built['error']).__name__}: {built['error']}") from built["error"]
        except BaseException:
            self._stop(graceful=False)
            raise
        self.rank0 = built["runner"]

    def _check(self, rank: int, reply: tuple) -> None:
        status, message = reply
        if status != "ok":
            raise TargetError(f"target.engine: TP rank {rank} of {self.tp_size} failed: {message}")

    def _all(self, op: str, payload, local):
        try:
            for c in self.conns:
                c.send((op, payload))
            out = local(payload)
            for rank, c in enumerate(self.conns, start=1):
                while not c.poll(1.0):
                    if not self.procs[rank - 1].is_alive():
                        raise TargetError(f"target.engine: TP rank {rank} of {self.tp_size} exited "
                                          f"(code {self.procs[rank - 1].exitcode}) during {op}")
                self._check(rank, c.recv())
        except BaseException:  # the ranks are out of step now (a collective may be half done): stop them all
            self._stop(graceful=False)
            raise
        return out

    def set_capture_layers(self, layer_ids: Sequence[int]) -> None:
        self._all("set_capture_layers", list(layer_ids), self.rank0.set_capture_layers)

    def run(self, rows: list[list[int]]) -> list[Tensor]:
        return self._all("run", rows, self.rank0.run)

    def close(self) -> None:
        try:
            for c in self.conns:
                c.send(("close", None))
            self.rank0.close()
        except (BrokenPipeError, EOFError, OSError):  # a rank already gone: nothing to close there
            pass
        finally:
            self._stop(graceful=True)

    def _stop(self, graceful: bool) -> None:
        for p in self.procs:
            if graceful:
                p.join(timeout=30)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        self.procs, self.conns = [], []
