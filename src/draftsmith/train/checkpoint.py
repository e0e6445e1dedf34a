"""Checkpoints: the servable draft plus everything an exact resume needs.

Layout (docs/reference/layouts.md; the paths and their readers are in :mod:`draftsmith.layout`)::

    <output_dir>/checkpoints/
      epoch_<E>_step_<S>/
        model/consolidated/{config.json, model.safetensors}   # the servable draft
        vocab.safetensors                                   # draft_ids (Vd,) d2t (Vd,) t2d (V,)
        optim.pt, rng.pt, meta.json                         # optimizer+scheduler, RNG, step/epoch/data position
        config.yaml                                         # the run config snapshot
      LATEST -> epoch_<E>_step_<S>                          # a symlink, moved only after a complete write
      BEST -> epoch_<E>_step_<S>                            # train.keep_best: the best held-out tau (train/held_out.py)

Every checkpoint is written into a hidden temporary directory and renamed into place with
``os.replace`` only when complete, and ``LATEST`` is swapped atomically after that, so a crash
mid-write never leaves a half-written checkpoint that looks valid (:mod:`draftsmith.atomic`); the next save
deletes what a killed one left.

optim.pt and rng.pt hold only tensors, numbers, strings and containers, and are read with
``torch.load(weights_only=True)``: resuming a run directory someone else wrote must not run code it
holds, so a file that would need more is refused (see :func:`_load_plain`).
"""

from __future__ import annotations

import json
import pickle
import random
import re
import warnings
from pathlib import Path
from typing import Any, Optional

import torch

from draftsmith import atomic
# The layout and its readers live below train/ (eval and serve read it too); re-exported here so the
# checkpoint API (write, read, find) is one import for the trainer and its tests.
from draftsmith.layout import (MODEL_SUBDIR, REQUIRED_FILES, best_checkpoint, checkpoint_name,  # noqa: F401
                               latest_checkpoint, resolve_resume)
from draftsmith.drafts import family_of_config
from draftsmith.targets.contract import ENGINE_ORDER_WHY
from draftsmith.weights import CheckpointError, read_tensors  # noqa: F401  (CheckpointError is re-exported)


def rng_state() -> dict[str, Any]:
    """This process's RNG states (torch CPU, the current CUDA device's when there is one, Python, numpy).

    Plain tensors, ints, floats, strings and tuples only: rng.pt is read with ``weights_only=True``,
    which refuses numpy arrays, so numpy's MT19937 key array is stored as a list of ints."""
    import numpy as np

    algo, keys, pos, has_gauss, cached = np.random.get_state()
    numpy_state = (str(algo), [int(k) for k in keys], int(pos), int(has_gauss), float(cached))
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": numpy_state}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any], rank: int = 0) -> bool:
    """Restore rank ``rank``'s RNG states from an ``rng.pt`` dict; False when the checkpoint has none
    for that rank (it was cut by fewer ranks): that rank then takes rank 0's."""
    import numpy as np

    ranks = state.get("ranks") or [state]
    own = rank < len(ranks)
    state = ranks[rank if own else 0]
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])  # a list of ints (this format) or an ndarray (rng.pt of older draftsmith)
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    return own


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def save_checkpoint(
    root: Path,
    epoch: int,
    step: int,
    *,
    model_state: dict[str, torch.Tensor],
    model_config: dict,
    vocab: dict[str, torch.Tensor],
    optim_state: dict[str, Any],
    meta: dict[str, Any],
    run_config_yaml: str,
    rng_states: Optional[list[dict[str, Any]]] = None,
) -> Path:
    """Write a complete checkpoint under ``root`` atomically and point ``LATEST`` at it.

    ``rng_states``: every rank's :func:`rng_state`, in rank order (default: this process's); rng.pt
    holds rank 0's at the top level and all of them under ``ranks``."""
    from safetensors.torch import save_file

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    name = checkpoint_name(epoch, step)
    final = root / name
    # a killed save's half checkpoint (model + optimizer state: the largest files a run writes); never LATEST
    atomic.remove_stale_temps(root, ".*.tmp")
    tmp = atomic.temp_dir_beside(final)
    (tmp / MODEL_SUBDIR).mkdir(parents=True)
    # safetensors needs contiguous, non-shared tensors
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in model_state.items()}
    save_file(tensors, str(tmp / MODEL_SUBDIR / "model.safetensors"), metadata={"format": "pt"})
    _write_json(tmp / MODEL_SUBDIR / "config.json", model_config)
    save_file({k: v.contiguous() for k, v in vocab.items()}, str(tmp / "vocab.safetensors"))
    torch.save(optim_state, tmp / "optim.pt")
    states = rng_states or [rng_state()]
    torch.save({**states[0], "ranks": states}, tmp / "rng.pt")
    (tmp / "config.yaml").write_text(run_config_yaml)
    # meta.json last: its presence inside the tmp dir marks the write as complete
    _write_json(tmp / "meta.json", {**meta, "epoch": epoch, "step": step})
    atomic.swap_dir(tmp, final)  # re-saving the same step (a resumed run) swaps the old one out
    point(root, "LATEST", name)
    return final


def point(root: Path, link: str, name: str) -> None:
    """Point the symlink ``root/link`` (LATEST, BEST) at the checkpoint ``name`` atomically: a new link
    under a temporary name, then ``os.replace`` over the old one, so a reader never finds none."""
    atomic.point(Path(root) / link, name)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load and verify a checkpoint directory written by :func:`save_checkpoint`."""
    path = Path(path)
    missing = [str(f) for f in REQUIRED_FILES if not (path / f).is_file()]
    if missing:
        raise CheckpointError(
            f"checkpoint '{path}' is incomplete (missing {', '.join(missing)}); "
            "resume from another epoch_*_step_* directory or from LATEST"
        )
    model_state = read_tensors(path / MODEL_SUBDIR / "model.safetensors")
    vocab = read_tensors(path / "vocab.safetensors")
    try:
        config = json.loads((path / MODEL_SUBDIR / "config.json").read_text())
        meta = json.loads((path / "meta.json").read_text())
        optim = _load_plain(path / "optim.pt")
        rng = _load_plain(path / "rng.pt", _old_numpy_rng_globals())
    except (json.JSONDecodeError, RuntimeError, EOFError, OSError) as e:
        raise CheckpointError(
            f"checkpoint '{path}' is corrupt or truncated ({type(e).__name__}: {str(e).splitlines()[0][:120]}); "
            "resume from another checkpoint"
        ) from None
    return {"model_state": model_state, "vocab": vocab, "config": config, "meta": meta, "optim": optim, "rng": rng}


def check_family(saved: dict, where: Path, draft_type: str) -> None:
    """Refuse to resume a checkpoint of another family than ``draft_type`` (before any heavy work)."""
    # meta.json names the family; a checkpoint older than that field is classified by its config.json
    was_type = saved["meta"].get("draft_type") or family_of_config(saved["config"])
    if was_type != draft_type:
        raise CheckpointError(f"{where}: a {was_type} checkpoint cannot resume a draft.type "
                              f"{draft_type} run; set draft.type: {was_type} or start a new output.dir")


def flat_config(config: dict, prefix: str = "") -> dict:
    """A config.json dict with nested dicts flattened to dotted keys (``dflash_config.mask_token_id``)."""
    out = {}
    for k, v in config.items():
        if isinstance(v, dict) and v:
            out.update(flat_config(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_resumable(saved: dict, where: Path, data_order: dict, draft_config: dict, optimizer: str) -> None:
    """Refuse a checkpoint (``saved``, from :func:`load_checkpoint` of ``where``) this run cannot
    continue: another data order (``data_order``: what fixes it now), aux ids trained in an order the
    engines do not serve, a draft config (``draft_config``: this run's export config) that differs
    from the one its weights were trained as, or another ``train.optimizer`` (``optimizer``)."""
    # row_pos indexes this epoch's order: it must be the order the checkpoint was cut from. The
    # global batch may change (another number of ranks): the order of conversations stays.
    was, now = saved["meta"].get("data_order"), data_order
    if was is not None and any(was.get(k) != now[k] for k in now):
        diff = ", ".join(f"{k} {was.get(k)} -> {now[k]}" for k in now if was.get(k) != now[k])
        raise CheckpointError(
            f"{where}: the data order changed since this checkpoint ({diff}); resume with the "
            f"checkpoint's values (its config.yaml) or start a new run in another output.dir")
    was_ids = saved["meta"].get("aux_layer_ids")
    if was_ids and list(was_ids) != sorted(was_ids):  # trained before aux ids were sorted: fc's blocks differ
        raise CheckpointError(
            f"{where}: trained with aux layer ids {list(was_ids)} in that order, and runs now train "
            f"them ascending ({ENGINE_ORDER_WHY}); serve or export it as it is (`draftsmith export` reorders its "
            "fc for the engines) or start a new run in another output.dir")
    # The draft's own config (mask token, depths, layers, aux ids, vocab sizes...) must be the
    # one the weights were trained as: a changed value would load and train on silently.
    # Nested sections are compared key by key, so the message names e.g. dflash_config.mask_token_id.
    was_cfg = flat_config(saved["config"])
    now_cfg = flat_config(json.loads(json.dumps(draft_config)))
    changed = [f"{k} {was_cfg.get(k)!r} -> {now_cfg.get(k)!r}" for k in sorted(set(was_cfg) | set(now_cfg))
               if was_cfg.get(k) != now_cfg.get(k)]
    if changed:
        raise CheckpointError(
            f"{where}: the draft's config changed since this checkpoint ({'; '.join(changed[:4])}); "
            "resume with the checkpoint's values (its config.yaml) or start a new run in another output.dir")
    state, muon = saved["optim"]["optimizer"], optimizer == "muon"
    if isinstance(state, dict) and ("parts" in state) != muon:  # one run's optimizer state under another
        raise CheckpointError(
            f"{where}: the checkpoint was trained with train.optimizer: {'adamw' if muon else 'muon'}, this run "
            f"asks for {optimizer}; resume with the checkpoint's optimizer (its config.yaml) or start a new run in "
            "another output.dir")


def _old_numpy_rng_globals() -> list:
    """What an rng.pt written before numpy states were stored as lists needs beyond plain types: one
    uint32 ndarray (numpy's MT19937 key). Exactly those globals, so old run dirs resume and nothing
    else numpy can pickle is let through."""
    import numpy as np

    try:
        from numpy._core.multiarray import _reconstruct  # numpy >= 2
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct
    allowed: list = [np.ndarray, np.dtype, type(np.dtype(np.uint32))]  # numpy >= 1.25: numpy.dtypes.UInt32DType
    # The pickle names the module of the numpy that wrote it; a file from numpy 1.x read under 2.x says
    # numpy.core.multiarray, so the same function is allowed under both names.
    allowed += [(_reconstruct, f"{m}.multiarray._reconstruct") for m in ("numpy._core", "numpy.core")]
    return allowed


def _load_plain(path: Path, allowed: Optional[list] = None) -> Any:
    """``torch.load(weights_only=True)`` of a checkpoint file: tensors, numbers, strings and containers
    only (plus ``allowed`` globals). Unpickling anything else can run code chosen by whoever wrote the
    file, so a file that needs more is refused in one line rather than loaded."""
    try:
        with torch.serialization.safe_globals(allowed or []), warnings.catch_warnings():
            # A file pickled outside torch.save warns of its protocol on stderr before it is refused.
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's message is many lines of advice to load it unsafely; keep only what the file holds
        # (its wording varies with the torch version: an allow-list miss, a blocked module, a class).
        found = re.search(r"GLOBAL (\S+)|got <class '([^']+)'>", str(e))
        what = f" ({found.group(1) or found.group(2)})" if found else ", or is corrupt"
        raise CheckpointError(
            f"{path}: holds objects that are not plain tensors/numbers{what}; "
            "draftsmith refuses to unpickle them, since that can run any code; resume from a checkpoint "
            "draftsmith wrote, or train again without --resume") from None
