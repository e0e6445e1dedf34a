"""Target engines behind one small contract.

An *engine* runs the frozen target and returns *features* for a batch. Every engine (hf, vllm,
sglang, remote) implements :class:`Engine`; the supervision math that turns features into draft
training targets lives once in :mod:`draftsmith.targets.contract`.

Layer ids follow the vLLM convention everywhere (config, CLI, wire): id ``i`` is the residual stream
after ``i`` decoder layers, ``0`` is the embedding output and ``L`` is the last layer's output
*before* the final norm. DFlash checkpoints count decoder-layer outputs instead (their id ``j`` is our
``j + 1``); :mod:`draftsmith.targets.contract` converts at that boundary only.

Heavy engine modules (vllm, sglang) are imported only by :func:`open_engine`, never at import time.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional, Protocol, Sequence

if TYPE_CHECKING:  # torch is only needed for annotations here
    from torch import Tensor


@dataclass(frozen=True)
class TargetInfo:
    """Static facts about the target that drafts and checks need."""

    num_layers: int  # L, number of decoder layers
    hidden_size: int
    vocab_size: int  # rows of the input embedding (may exceed the tokenizer's length)
    dtype: str  # "float32" | "bfloat16" | "float16"
    model_type: str  # e.g. "llama", "qwen3"
    tied: bool  # lm_head shares the input embedding
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    intermediate_size: int = 0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    rope_scaling: Optional[dict] = None
    # the head's form (supervision/head.py HeadForm): (w + norm_offset) final norm, logits * multiplier, softcap
    norm_offset: float = 0.0
    logit_multiplier: float = 1.0
    logit_softcap: Optional[float] = None

    def head_form(self) -> "Any":
        from draftsmith.supervision.head import HeadForm

        return HeadForm(self.norm_offset, self.logit_multiplier, self.logit_softcap)

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


@dataclass
class Batch:
    """One batch of rendered conversations.

    input_ids:      (B, S) int64
    attention_mask: (B, S) int64, 1 on real tokens (right padding)
    loss_mask:      (B, S) int64, 1 exactly on assistant tokens
    """

    input_ids: "Tensor"
    attention_mask: "Tensor"
    loss_mask: "Tensor"

    def to(self, device: Any) -> "Batch":
        return Batch(self.input_ids.to(device), self.attention_mask.to(device), self.loss_mask.to(device))


@dataclass
class Features:
    """What an engine returns for a batch.

    aux_hidden: (B, S, n_ids, H) hidden states at the requested layer ids, in request order,
                UNSHIFTED (position t is the state after reading token t).
    logits:     (B, S, V) full-vocab target logits, or None when not requested.
    """

    aux_hidden: "Tensor"
    logits: Optional["Tensor"] = None


class Engine(Protocol):
    """The engine contract every target backend implements.

    Beyond features, the trainer needs the target's weights (a draft copies or shares them) and
    supervision of a named kind (targets/contract.py :data:`~draftsmith.targets.contract.SUPERVISION`).
    Co-located engines get :meth:`set_vocab_map` and :meth:`supervision` from :class:`ColocatedEngine`;
    the remote engine computes supervision on its servers.
    """

    def info(self) -> TargetInfo:
        """Static facts about the target (layers, sizes, dtype, rope)."""
        ...

    def features(self, batch: Batch, layer_ids: Sequence[int], *, logits: bool) -> Features:
        """Hidden states at ``layer_ids`` (vLLM convention) for ``batch``, and the logits when ``logits``."""
        ...

    def embeddings(self) -> "Tensor":  # (V, H) input embedding
        """The target's input embedding, (V, H)."""
        ...

    def lm_head_weight(self) -> "Tensor":  # (V, H) output projection; TargetError when unavailable
        """The target's output projection, (V, H); a TargetError when the engine cannot give it."""
        ...

    def final_norm_weight(self) -> "Tensor":  # (H,) final norm weight; TargetError when unavailable
        """The target's final norm weight, (H,); a TargetError when the engine cannot give it."""
        ...

    def set_vocab_map(self, draft_ids: Optional["Tensor"]) -> None:  # (Vd,) int64, None = full vocab
        """Project supervision onto the draft vocab ``draft_ids`` (Vd,) int64; None = the full vocab."""
        ...

    def supervision(self, kind: str, batches: Iterable[Batch],
                    layer_ids: Sequence[int]) -> Iterator[tuple[Batch, Any]]:  # (batch, supervision) in order
        """``(batch, supervision of kind)`` for each of ``batches``, in order."""
        ...

    def close(self) -> None:
        """Release the engine (processes, GPU memory, connections)."""
        ...


class ColocatedEngine:
    """:meth:`set_vocab_map` and :meth:`supervision` for engines that run the target in this process.

    The supervision math runs here on the engine's own features, one batch at a time. The vocab map
    is kept for kinds that project onto the draft vocab (``eagle3``); others ignore it.
    """

    _draft_ids: Optional["Tensor"] = None

    def set_vocab_map(self, draft_ids: Optional["Tensor"]) -> None:
        """Use ``draft_ids`` (Vd,) int64 for draft-vocab supervision; None = the full vocab."""
        self._draft_ids = draft_ids

    def supervision(self, kind: str, batches: Iterable[Batch], layer_ids: Sequence[int]) -> Iterator[tuple[Batch, Any]]:
        """``(batch, supervision of kind)`` for each batch, in order (a generator: ``close()`` stops it)."""
        from draftsmith.targets.contract import supervision_kind

        supervision_kind(kind)  # an unknown kind fails here, before any forward
        for b in batches:
            yield b, supervision_for(self, kind, b, layer_ids, self._draft_ids)  # type: ignore[arg-type]


def target_head(engine: Any) -> Any:
    """The engine's :class:`~draftsmith.targets.contract.TargetHead`: its own ``target_head()`` when it has
    one (the hf engine: the model's norm and output modules), else its final norm weight, lm_head and
    eps through :func:`~draftsmith.targets.contract.rebuild_logits` (engines that return states only)."""
    from draftsmith.supervision.head import TargetHead

    own = getattr(engine, "target_head", None)
    if own is not None:
        return own()
    info = engine.info()
    return TargetHead.from_weights(engine.final_norm_weight(), engine.lm_head_weight(), info.rms_norm_eps,
                                   info.head_form())


def supervision_for(engine: Any, kind: str, batch: Batch, layer_ids: Sequence[int], draft_ids: Optional["Tensor"]) -> Any:
    """Supervision of ``kind`` for one batch from ``engine`` (co-located, or behind serve-target).

    A kind that needs the target's logits gets them as the pre-norm state at layer id L, requested as one
    more aux layer, and the target head that projects it: the supervision builds logits in chunks of
    positions, so no engine hands over a (B, S, V) tensor (for a 128k vocabulary at 4k positions that
    is 2 GiB in fp32). ``features.aux_hidden`` keeps only the draft's own ids, in their order.
    """
    from draftsmith.targets.contract import TargetError, supervise, supervision_kind

    k = supervision_kind(kind)
    ids = list(layer_ids)
    head = None
    if k.logits:
        try:
            head = target_head(engine)
        except TargetError:  # an engine that returns logits but not its head's weights: logits it is
            pass
    if head is None:
        return supervise(kind, batch, engine.features(batch, ids, logits=k.logits), draft_ids)
    L = engine.info().num_layers
    request = ids if L in ids else ids + [L]
    feats = engine.features(batch, request, logits=False)  # aux (B, S, n [+1], H)
    last = feats.aux_hidden[:, :, request.index(L)]  # (B, S, H) pre-norm state at id L
    aux = feats.aux_hidden if len(request) == len(ids) else feats.aux_hidden[:, :, : len(ids)]
    return supervise(kind, batch, Features(aux_hidden=aux), draft_ids, last_hidden=last, head=head)


# Dotted paths keep heavy engines lazy: importing this package never imports vllm or sglang.
ENGINES: dict[str, str] = {
    "hf": "draftsmith.targets.hf:HFEngine",
    "vllm": "draftsmith.targets.vllm:VLLMEngine",
    "sglang": "draftsmith.targets.sglang:SGLangEngine",
    "remote": "draftsmith.remote.client:RemoteEngine",
    "cache": "draftsmith.targets.cache:CacheEngine",  # an offline feature cache (draftsmith cache)
}


# Each engine's own name for its tensor-parallel degree: `serve-target --tp-size` and `target.tp_size`
# are one spelling for both, translated here into the keyword the engine's constructor takes.
TP_KWARG: dict[str, str] = {"vllm": "tensor_parallel_size", "sglang": "tp_size"}


def tp_engine_kwargs(name: str, tp_size: Optional[int], engine_kwargs: Optional[dict]) -> dict:
    """``engine_kwargs`` plus engine ``name``'s tensor-parallel keyword set to ``tp_size`` (None: unchanged).

    Callers check first that ``name`` is in :data:`TP_KWARG` and that ``engine_kwargs`` does not
    already give that keyword another value (their errors name their own flag or config key).
    """
    kwargs = dict(engine_kwargs or {})
    if tp_size is not None:
        kwargs[TP_KWARG[name]] = int(tp_size)
    return kwargs


def check_engine(name: str) -> None:
    """Fail fast (before data or the target loads) when engine ``name`` cannot run in this environment.

    Imports only the draftsmith engine module (never vllm/sglang themselves) and calls its
    ``check_available()``, which raises a one-line error naming the reason and the fix.
    """
    if name not in ENGINES:
        raise ValueError(f"target.engine: unknown engine {name!r}; expected one of {sorted(ENGINES)}")
    module = importlib.import_module(ENGINES[name].partition(":")[0])
    check = getattr(module, "check_available", None)
    if check is not None:
        check()


def open_engine(name: str, target: str, **kwargs: Any) -> Engine:
    """Open the engine ``name`` (a key of :data:`ENGINES`) on the target checkpoint ``target``."""
    if name not in ENGINES:
        raise ValueError(
            f"target.engine: unknown engine {name!r}; expected one of {sorted(ENGINES)}"
        )
    module_name, _, cls_name = ENGINES[name].partition(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls(target, **kwargs)
