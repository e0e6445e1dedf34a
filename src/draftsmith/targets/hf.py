"""The hf engine: runs the target with transformers in this process.

It is the reference engine: every other engine's features must equal these (tolerance by dtype).

Layer ids (vLLM convention) map onto transformers 5.x outputs as follows. With
``output_hidden_states=True`` a model with L decoder layers returns L + 1 states; states ``0..L-1`` are
the residual stream after ``i`` layers (0 = embedding output), but the LAST entry is taken AFTER the
final norm. So ids ``< L`` read ``hidden_states[i]`` and id ``L`` (the pre-norm residual stream) is
captured by a forward pre-hook on the final norm.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from draftsmith.targets import Batch, ColocatedEngine, Features, TargetInfo
from draftsmith.targets.contract import TargetError, validate_layer_ids

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def info_from_config(cfg, *, dtype: str, tied: bool, vocab_size: Optional[int] = None) -> TargetInfo:
    """:class:`TargetInfo` from a HF (text) config; ``vocab_size`` defaults to the config's."""
    heads = int(cfg.num_attention_heads)
    rope_theta, rope_scaling = _rope(cfg)
    return TargetInfo(
        num_layers=int(cfg.num_hidden_layers),
        hidden_size=int(cfg.hidden_size),
        vocab_size=int(vocab_size if vocab_size is not None else cfg.vocab_size),
        dtype=dtype,
        model_type=str(cfg.model_type),
        tied=tied,
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads),
        intermediate_size=draft_mlp_width(cfg),
        rms_norm_eps=float(getattr(cfg, "rms_norm_eps", None) or getattr(cfg, "layer_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        max_position_embeddings=int(getattr(cfg, "max_position_embeddings", 2048)),
        rope_scaling=rope_scaling,
        **head_fields(cfg),
    )


DEVICE_MAPS = (None, "auto")  # target.device_map / serve-target --device-map: one device, or accelerate's spread


def draft_mlp_width(cfg) -> int:
    """The MLP width a draft of this target gets (TargetInfo.intermediate_size).

    Dense targets: their own ``intermediate_size``. MoE targets (any of ``EXPERT_KEYS`` set): the width one
    token runs through, experts per token x one expert's width (``moe_intermediate_size``, else
    ``intermediate_size`` where that is the expert's, as in Mixtral and GPT-OSS), at most 4 x hidden: a dense
    ``intermediate_size`` beside the experts (DeepSeek-V3's 18,432 for its first dense layers) would give a
    0.4 B-parameter draft MLP, and one expert's width (GPT-OSS's 2,880 = 1 x hidden) a starved one.
    Qwen3-30B-A3B 768 x 8 = 6,144; DeepSeek-V3 2,048 x 8 = 16,384; GPT-OSS-120B 2,880 x 4 = 11,520."""
    from draftsmith.targets.architecture import EXPERT_KEYS

    dense = int(getattr(cfg, "intermediate_size", 0) or 0)
    if not any(getattr(cfg, k, None) for k in EXPERT_KEYS):
        return dense
    expert = int(getattr(cfg, "moe_intermediate_size", None) or dense)
    per_token = int(getattr(cfg, "num_experts_per_tok", None) or getattr(cfg, "experts_per_token", None) or 1)
    return min(expert * per_token, 4 * int(cfg.hidden_size))


def head_fields(cfg) -> dict:
    """TargetInfo's head-form fields (supervision/head.py HeadForm, same names) from the target's config."""
    from dataclasses import asdict

    from draftsmith.supervision.head import head_form_of

    return asdict(head_form_of(cfg))


def check_device_map(device_map: Optional[str]) -> None:
    """Refuse a ``device_map`` this machine cannot honour, in one line naming the key and the fix.

    ``auto`` spreads the target's layers over the visible GPUs (accelerate); without CUDA it would
    quietly put everything on the CPU (or the disk), which is never what a run config asking for it
    meant, so it is an error rather than a fallback.
    """
    key = "target.device_map (serve-target --device-map)"
    if device_map not in DEVICE_MAPS:
        raise TargetError(f"{key}: {device_map!r} is not supported; use auto (spread the target over the visible "
                          f"GPUs) or null (the whole target on one device: train.device / --device)")
    if device_map is None:
        return
    if not torch.cuda.is_available():
        raise TargetError(f"{key}: {device_map!r} but this machine has no CUDA GPU (torch {torch.__version__}); "
                          f"set target.device_map: null (or drop --device-map) to run the target on one device")
    import importlib.util

    if importlib.util.find_spec("accelerate") is None:
        raise TargetError(f"{key}: {device_map!r} needs accelerate, which is not installed; pip install "
                          f"accelerate, or set target.device_map: null (or drop --device-map)")


class HFEngine(ColocatedEngine):
    """A frozen HF causal LM behind the :class:`~draftsmith.targets.Engine` contract.

    ``target`` is a HF checkpoint directory or ``"smollm2"`` (the embedded default, see
    :mod:`draftsmith.models`). ``dtype`` is one of ``float32``, ``bfloat16``, ``float16``.
    ``device``: where the whole target runs. ``device_map="auto"`` instead lets accelerate spread its
    layers over the visible GPUs (a target too big for one); ``device`` is then ignored, inputs go to
    the GPU holding the embedding and every feature is gathered there (``.device``).
    The tokenizer is available as ``.tokenizer`` and the model as ``.model``.
    """

    def __init__(self, target: Union[str, os.PathLike], *, dtype: str = "float32", device: str = "cpu",
                 device_map: Optional[str] = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        from draftsmith.models import resolve_target

        hf_logging.disable_progress_bar()  # per-load bars would bury our own progress and errors

        if dtype not in DTYPES:
            raise TargetError(f"target.dtype: {dtype!r} is not supported; use one of {sorted(DTYPES)}")
        check_device_map(device_map)  # before the (possibly huge) load
        self.path = Path(resolve_target(target))
        from draftsmith.targets.architecture import check_transformers

        check_transformers(self.path)  # an architecture transformers lacks: one line, not AutoConfig's ValueError
        self.dtype = dtype
        self.device_map = device_map
        self.tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        load = {"dtype": DTYPES[dtype], "local_files_only": True}
        if device_map is not None:
            load["device_map"] = device_map  # accelerate places each layer as the weights load
        model = AutoModelForCausalLM.from_pretrained(self.path, **load)
        if device_map is None:
            model = model.to(torch.device(device))
        # with a device map, the first device: where input ids must go (the embedding) and features gather
        self._adopt(model, model.get_input_embeddings().weight.device)

    @classmethod
    def from_model(cls, model, *, dtype: str, tokenizer=None) -> "HFEngine":
        """An engine over an already-loaded HF causal LM (kept on its device, frozen, eval mode), e.g.
        a target built from a config in a benchmark or one a user has loaded their own way."""
        if dtype not in DTYPES:
            raise TargetError(f"target.dtype: {dtype!r} is not supported; use one of {sorted(DTYPES)}")
        eng = cls.__new__(cls)
        eng.path, eng.dtype, eng.tokenizer = Path(getattr(model.config, "_name_or_path", "") or "."), dtype, tokenizer
        eng.device_map = None
        eng._adopt(model, model.get_input_embeddings().weight.device)
        return eng

    def _adopt(self, model, device: torch.device) -> None:
        """Take ``model`` as the frozen target whose inputs go to ``device``."""
        self.device = torch.device(device)
        self.model = model.eval().requires_grad_(False)
        self._norm = final_norm(self.model)
        self._num_layers = int(self.model.config.get_text_config().num_hidden_layers)

    # ------------------------------------------------------------------ static facts
    def info(self) -> TargetInfo:
        """Architecture facts read from the loaded config and weights."""
        rows = int(self.model.get_input_embeddings().weight.shape[0])  # may exceed the config's vocab
        return info_from_config(self.model.config.get_text_config(), dtype=self.dtype, tied=self._tied(),
                                vocab_size=rows)

    def _tied(self) -> bool:
        # Ask the weights, not the config: the tie is what drafts that share the lm_head rely on.
        out = self.model.get_output_embeddings()
        embed = self.model.get_input_embeddings().weight
        return out is not None and out.weight.data_ptr() == embed.data_ptr()

    # ------------------------------------------------------------------ features
    def features(self, batch: Batch, layer_ids: Sequence[int], *, logits: bool) -> Features:
        """One target forward; aux hidden states at ``layer_ids`` (request order) and optional logits.

        aux_hidden: (B, S, n, H) in the model dtype. logits: (B, S, V) in the model dtype (float32
        for a float32 target) or None.
        """
        L = self._num_layers
        ids = validate_layer_ids(layer_ids, L)
        batch = batch.to(self.device)
        captured: dict[str, Tensor] = {}
        hook = None
        if L in ids:
            # Id L is the last decoder layer's output before the final norm: the norm's input.
            def grab(_module, args):
                captured["pre_norm"] = args[0]

            hook = self._norm.register_forward_pre_hook(grab)
        try:
            # no_grad rather than inference_mode: inference tensors cannot be saved for backward, and
            # aux states / target probs feed the draft's autograd graph (e.g. fc(aux) needs aux saved).
            with torch.no_grad():
                out = self.model(
                    input_ids=batch.input_ids,
                    attention_mask=batch.attention_mask,
                    output_hidden_states=True,
                    use_cache=False,
                    # Skip the (B, S, V) lm_head when logits are not wanted (it is ~20% of SmolLM2's
                    # forward); 1 keeps only the last position, which we discard.
                    logits_to_keep=0 if logits else 1,
                )
        finally:
            if hook is not None:
                hook.remove()
        states = out.hidden_states  # L + 1 entries of (B, S, H); [L] is after the final norm
        if len(states) != L + 1:
            raise TargetError(
                f"target: expected {L + 1} hidden states from {self.path}, got {len(states)}; "
                f"this architecture's outputs do not follow the transformers 5.x layout, use another engine"
            )
        # Under a device_map each layer's state lives on that layer's GPU: gather onto the first
        # device (a no-op on one device). n x (B, S, H) -> (B, S, n, H).
        picked = [(captured["pre_norm"] if i == L else states[i]).to(self.device) for i in ids]
        aux = torch.stack(picked, dim=2)
        return Features(aux_hidden=aux, logits=out.logits.to(self.device) if logits else None)

    def target_head(self):
        """The model's own head as a :class:`~draftsmith.targets.contract.TargetHead`: its final norm
        module, then its output embedding, the two modules its forward applies to layer id L's state, so
        logits built from the state in chunks are the forward's logits row for row."""
        from draftsmith.supervision.head import TargetHead

        model, norm = self.model, self._norm
        out = model.get_output_embeddings()

        def project(h: Tensor) -> Tensor:  # (N, H) -> (N, V)
            with torch.no_grad():
                return out(norm(h)) if out is not None else torch.nn.functional.linear(norm(h), self.embeddings())

        return TargetHead(project, int(self.lm_head_weight().shape[0]))

    # ------------------------------------------------------------------ weights
    def embeddings(self) -> Tensor:
        """(V, H) input embedding; shares storage with the target (copy before modifying)."""
        return self.model.get_input_embeddings().weight.detach()

    def lm_head_weight(self) -> Tensor:
        """(V, H) output projection; the input embedding itself when the target is tied."""
        out = self.model.get_output_embeddings()
        return (out.weight if out is not None else self.model.get_input_embeddings().weight).detach()

    def final_norm_weight(self) -> Tensor:
        """(H,) weight of the final norm (applied to layer id L before the lm_head)."""
        return self._norm.weight.detach()

    def close(self) -> None:
        """Release the model; the engine is unusable afterwards."""
        self.model = None  # type: ignore[assignment]
        self._norm = None  # type: ignore[assignment]
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def __enter__(self) -> "HFEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def final_norm(model) -> torch.nn.Module:
    """The decoder's final norm module (``model.model.norm`` for Llama/Qwen/Mistral families)."""
    decoder = model.get_decoder()
    for name in ("norm", "final_layernorm", "final_layer_norm", "ln_f"):
        module = getattr(decoder, name, None)
        if isinstance(module, torch.nn.Module):
            return module
    raise TargetError(
        f"target: cannot find the final norm of {type(model).__name__} (looked for decoder.norm/"
        f"final_layernorm/ln_f); layer id L needs it, so use a Llama-style target or another engine"
    )


def _rope(cfg) -> tuple[float, Optional[dict]]:
    """(rope_theta, rope_scaling) from a transformers 4.x or 5.x config.

    5.x keeps theta and scaling in ``rope_parameters`` (possibly one dict per attention type);
    4.x has ``rope_theta`` plus ``rope_scaling``. Scaling is None for plain (``default``) RoPE.
    """
    params = getattr(cfg, "rope_parameters", None)
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        # Per-layer-type parameters (e.g. full vs sliding attention): full attention is the global one.
        params = params.get("full_attention") or next(iter(params.values()))
    if not isinstance(params, dict) or not params:
        params = dict(getattr(cfg, "rope_scaling", None) or {})
    theta = params.get("rope_theta", getattr(cfg, "rope_theta", None))
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    return float(theta if theta is not None else 10000.0), (scaling if kind != "default" else None)
