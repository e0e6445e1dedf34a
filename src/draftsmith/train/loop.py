"""The draft trainer. Reads top to bottom: setup, loop, eval, save.

The draft family (``draft.type``, drafts/__init__.py) decides the model, the supervision kind it
learns from and its metrics; the engine turns each micro-batch into that supervision (co-located:
features + targets/contract.py here; remote: on the servers), then the draft runs one forward.
Everything that decides the result (data order, optimizer, schedule, RNG) is restored by
``resume`` so a resumed run reaches the same weights as an uninterrupted one.

Several ranks (torchrun) are the parallel layer's business (train/parallel.py, ``self.par``), as in
torchtitan: it wraps the draft in DDP or FSDP2 from outside, hands this rank its rows of each
*global* micro-batch, sums losses' denominators and metrics over ranks, keeps the data position in
the global order and runs rank-0-only I/O. The loop below reads as one process's; N ranks x batch b
reach the weights one rank x batch N*b does. Each rank opens its own engine.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import torch

from draftsmith.config import ConfigError, RunConfig, dump_config
from draftsmith.data.dataset import Example, collate, epoch_order, holdout_from_sources, length_grouped, split_holdout
from draftsmith.data.sources import iter_rows
from draftsmith.data.vocab_cache import VocabMap, draft_vocab_for
from draftsmith.drafts import family_of_config, get_family
from draftsmith.inputs import aux_layer_ids, aux_order_note, render_examples, resolve_template_kwargs
from draftsmith.targets import Batch, TargetInfo, check_engine, open_engine
from draftsmith.targets.contract import ENGINE_ORDER_WHY, supervision_kind, supervision_to
from draftsmith.train import checkpoint as ckpt
from draftsmith.train import parallel
from draftsmith.train.optim import build_optimizer
from draftsmith.train.schedule import Cosine, reachable_step


@dataclass
class TrainResult:
    output_dir: Path
    checkpoint: Optional[Path]
    step: int
    epoch: int
    tokens: int  # real (non-pad) tokens the draft trained on in this run, all ranks together
    wall_s: float
    tokens_per_s: float
    eval: dict = field(default_factory=dict)
    history: list = field(default_factory=list)  # (step, loss) per optimizer step


def build_draft(cfg: RunConfig, info: TargetInfo, vocab: VocabMap, layer_ids: list[int]):
    """A fresh draft of family ``draft.type`` for this target, over the selected draft vocab, reading
    the target's ``layer_ids`` (engine convention)."""
    family = get_family(cfg.draft.type)
    try:  # values only checkable against the target (e.g. mask_token_id within its vocab)
        config = family.config_from_target(info, cfg.draft, draft_vocab_size=int(vocab.draft_ids.numel()),
                                           num_layer_ids=len(layer_ids), layer_ids=list(layer_ids))
    except ValueError as e:
        raise ConfigError([f"draft.{e}"]) from None
    return family.Model(config)


def flat_config(config: dict, prefix: str = "") -> dict:
    """A config.json dict with nested dicts flattened to dotted keys (``dflash_config.mask_token_id``)."""
    out = {}
    for k, v in config.items():
        if isinstance(v, dict) and v:
            out.update(flat_config(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def add_sums(total: Optional[dict], sums: dict) -> dict:
    """Element-wise sum of two metric-sum dicts (``total`` None = start from ``sums``)."""
    return dict(sums) if total is None else {k: total[k] + v for k, v in sums.items()}


def remote_options(cfg: RunConfig) -> dict:
    """Keyword arguments of the remote engine (draftsmith.remote.client.RemoteEngine) from target.*."""
    t = cfg.target
    return {"urls": t.remote_urls, "prefetch_depth": t.prefetch_depth, "timeout_s": t.remote_timeout_s,
            "retries": t.remote_retries, "backoff_s": t.remote_backoff_s,
            "health_interval_s": t.remote_health_interval_s, "auth_token_file": t.remote_auth_token_file,
            "data_plane": t.remote_data_plane}


class Trainer:
    """Holds the run state; :meth:`run` is the whole training job."""

    def __init__(self, cfg: RunConfig, *, resume: Optional[str | Path] = None, progress: bool = True):
        self.cfg = cfg
        self.family = get_family(cfg.draft.type)  # drafts/<family>.py: model, supervision kind, metrics
        # torchrun's ranks (rank 0 of 1 without it), this rank's device, the process group (gloo / nccl)
        self.par = parallel.DataParallel.start(cfg.train)
        self.device = self.par.device
        self.progress = progress and self.par.main
        self.bf16 = cfg.train.bf16 if cfg.train.bf16 is not None else self.device.type == "cuda"
        if cfg.train.num_threads:
            torch.set_num_threads(cfg.train.num_threads)
        torch.manual_seed(cfg.train.seed)  # the same on every rank: every rank builds the same draft
        self.out = Path(cfg.output.dir)
        self.ckpt_root = self.out / "checkpoints"
        self.resumed_from = ckpt.resolve_resume(Path(resume)) if resume else None
        saved = ckpt.load_checkpoint(self.resumed_from) if self.resumed_from else None  # fail before heavy work
        # meta.json names the family; a checkpoint older than that field is classified by its config.json
        was_type = (saved["meta"].get("draft_type") or family_of_config(saved["config"])) if saved else cfg.draft.type
        if was_type != cfg.draft.type:
            raise ckpt.CheckpointError(f"{self.resumed_from}: a {was_type} checkpoint cannot resume a draft.type "
                                       f"{cfg.draft.type} run; set draft.type: {was_type} or start a new output.dir")
        check_engine(cfg.target.engine)  # an engine that cannot run here fails now, with the reason
        for spec in cfg.data.sources + cfg.data.eval_sources:
            iter_rows(spec)  # a missing file or unknown built-in fails now, not after the target loads
        self._open_engine()
        self._load_data()
        self._build_vocab(saved)
        self._build_draft()
        self.resume_note = None
        if saved is not None:
            self._restore_draft(saved)
        # DDP / FSDP2 around the draft (one rank: the plain draft); the optimizer sees the wrapped parameters
        self.model = self.par.wrap(self.draft)
        self._build_optimizer()
        if saved is not None:
            self._restore(saved)
        self.writer = self.par.writer(self.out / "tensorboard") if cfg.output.tensorboard else None  # rank 0's

    # ------------------------------------------------------------------ setup steps
    def _open_engine(self) -> None:
        """The target's engine, its info, the layer ids the draft reads and the tokenizer."""
        from transformers import AutoTokenizer

        from draftsmith.models import resolve_target

        cfg = self.cfg
        target_path = resolve_target(cfg.target.path)  # the remote engine needs it for the tokenizer only
        self.engine = open_engine(cfg.target.engine, target_path, dtype=cfg.target.dtype, device=str(self.device),
                                  **({"engine_kwargs": cfg.target.engine_kwargs} if cfg.target.engine_kwargs else {}),
                                  **(remote_options(cfg) if cfg.target.engine == "remote" else {}),
                                  **({"cache_dir": cfg.target.cache_dir} if cfg.target.engine == "cache" else {}))
        self.info = self.engine.info()
        self.aux_ids = aux_layer_ids(cfg, self.info.num_layers)
        self.tokenizer = AutoTokenizer.from_pretrained(target_path)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def _load_data(self) -> None:
        """Conversations -> rendered examples -> train / held-out split."""
        cfg = self.cfg
        self.template_kwargs = resolve_template_kwargs(cfg)
        examples, self.data_report, self.dropped = render_examples(cfg, self.tokenizer)
        eval_size = cfg.data.eval_size  # a fraction below 1, a count from 1 up
        if cfg.data.eval_sources:  # held out from other sources: the metric tracks text unlike the training rows
            held, _, held_dropped = render_examples(cfg, self.tokenizer, held_out=True)
            self.train_set, self.eval_set, in_train = holdout_from_sources(examples, held)
            self.held_out_from = (f"held-out from data.eval_sources {cfg.data.eval_sources}"
                                  + (f", {in_train} also in data.sources left out" if in_train else "")
                                  + (f", {held_dropped} without an assistant token dropped" if held_dropped else ""))
        else:
            self.train_set, self.eval_set = split_holdout(
                examples, int(eval_size) if eval_size >= 1 else float(eval_size), cfg.train.seed
            )
            self.held_out_from = f"held-out: data.eval_size={eval_size:g} of data.sources"

    def _build_vocab(self, saved: Optional[dict]) -> None:
        """The draft vocab (the checkpoint's on resume), told to the engine: a remote one computes
        draft-vocab supervision on its servers (pushed on start and resume)."""
        cfg = self.cfg
        cache_dir = Path(cfg.data.vocab_cache_dir) if cfg.data.vocab_cache_dir else self.out / "cache"
        draft_vocab_size = cfg.data.draft_vocab_size or self.info.vocab_size
        if not supervision_kind(self.family.SUPERVISION).vocab:  # e.g. DFlash: the target's lm_head, full vocab
            draft_vocab_size = self.info.vocab_size
        if saved is not None:  # the checkpoint's vocab map wins: the draft's lm_head rows follow it
            v = saved["vocab"]
            self.vocab = VocabMap(v["draft_ids"], v["d2t"], v["t2d"], saved["meta"].get("vocab_coverage", float("nan")),
                                  saved["meta"].get("vocab_fingerprint", ""))
        else:
            self.vocab = draft_vocab_for(self.train_set, self.tokenizer, self.info.vocab_size, draft_vocab_size, cache_dir)
        self.pruned = self.vocab.draft_ids.numel() < self.info.vocab_size
        self.engine.set_vocab_map(self.vocab.draft_ids if self.pruned else None)
        # The vocab is chosen on the train split, so its coverage there flatters it: the share of the
        # held-out split's loss-mask tokens inside the draft vocab is what text the draft was not
        # chosen on looks like (every other one is a certain miss). None without a held-out split.
        from draftsmith.drafts import vocab as vocab_math

        counts = vocab_math.token_counts(((ex.input_ids, ex.loss_mask) for ex in self.eval_set), self.info.vocab_size)
        self.held_out_coverage = vocab_math.coverage(counts, self.vocab.draft_ids) if int(counts.sum()) else None

    def _build_draft(self) -> None:
        """A fresh draft, given what it takes from the target (embeddings; lm_head + final norm if asked)."""
        self.draft = build_draft(self.cfg, self.info, self.vocab, self.aux_ids)
        self.family.attach_target(self.draft, self.cfg.draft, embeddings=self.engine.embeddings(),
                                  head=lambda: (self.engine.lm_head_weight(), self.engine.final_norm_weight()),
                                  vocab=self.vocab)
        self.draft.to(self.device)

    def _build_optimizer(self) -> None:
        """The optimizer (train/optim.py: AdamW, or Muon + AdamW) over the trainable parameters, and the
        LR schedule over the run's optimizer steps."""
        t = self.cfg.train
        self.optimizer = build_optimizer(self.model.named_parameters(), t)
        global_batch = self.par.global_batch  # conversations per micro-step, all ranks together
        self.steps_per_epoch = math.ceil(math.ceil(len(self.train_set) / global_batch) / t.grad_accum)
        self.total_steps = self.steps_per_epoch * t.epochs
        if t.max_steps is not None:
            self.total_steps = min(self.total_steps, t.max_steps)
        # The cosine ends at total_steps, or where train.max_time_s is expected to stop the run
        # (fit_schedule), so a time-bound run still anneals instead of stopping at a high LR.
        self.schedule = Cosine(t.warmup_steps, self.total_steps, t.min_lr_ratio)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.schedule)
        self.step = 0
        self.pos = parallel.Position(group_batch=global_batch)  # where the data order stands
        self.tokens_seen = 0  # real tokens trained on since step 0, all ranks, across resumes

    def _restore_draft(self, saved: dict) -> None:
        """The draft's weights from a checkpoint (before any wrapping), once its data order and config
        are checked against this run."""
        # row_pos indexes this epoch's order: it must be the order the checkpoint was cut from. The
        # global batch may change (another number of ranks): the order of conversations stays.
        was, now = saved["meta"].get("data_order"), self.data_order()
        if was is not None and any(was.get(k) != now[k] for k in now):
            diff = ", ".join(f"{k} {was.get(k)} -> {now[k]}" for k in now if was.get(k) != now[k])
            raise ckpt.CheckpointError(
                f"{self.resumed_from}: the data order changed since this checkpoint ({diff}); resume with the "
                f"checkpoint's values (its config.yaml) or start a new run in another output.dir")
        was_ids = saved["meta"].get("aux_layer_ids")
        if was_ids and list(was_ids) != sorted(was_ids):  # trained before aux ids were sorted: fc's blocks differ
            raise ckpt.CheckpointError(
                f"{self.resumed_from}: trained with aux layer ids {list(was_ids)} in that order, and runs now train "
                f"them ascending ({ENGINE_ORDER_WHY}); serve or export it as it is (`draftsmith export` reorders its "
                "fc for the engines) or start a new run in another output.dir")
        # The draft's own config (mask token, depths, layers, aux ids, vocab sizes...) must be the
        # one the weights were trained as: a changed value would load and train on silently.
        # Nested sections are compared key by key, so the message names e.g. dflash_config.mask_token_id.
        was_cfg = flat_config(saved["config"])
        now_cfg = flat_config(json.loads(json.dumps(self.draft.export_config(self.aux_ids, "float32"))))
        changed = [f"{k} {was_cfg.get(k)!r} -> {now_cfg.get(k)!r}" for k in sorted(set(was_cfg) | set(now_cfg))
                   if was_cfg.get(k) != now_cfg.get(k)]
        if changed:
            raise ckpt.CheckpointError(
                f"{self.resumed_from}: the draft's config changed since this checkpoint ({'; '.join(changed[:4])}); "
                "resume with the checkpoint's values (its config.yaml) or start a new run in another output.dir")
        self.draft.load_state_dict(saved["model_state"])

    def _restore(self, saved: dict) -> None:
        """Optimizer, scheduler, this rank's RNG and the data position from a checkpoint."""
        t = self.cfg.train
        state, muon = saved["optim"]["optimizer"], self.cfg.train.optimizer == "muon"
        if isinstance(state, dict) and ("parts" in state) != muon:  # one run's optimizer state under another
            raise ckpt.CheckpointError(
                f"{self.resumed_from}: the checkpoint was trained with train.optimizer: "
                f"{'adamw' if muon else 'muon'}, this run asks for {self.cfg.train.optimizer}; resume with the "
                "checkpoint's optimizer (its config.yaml) or start a new run in another output.dir")
        parallel.load_optimizer(self.model, self.optimizer, state)
        self.scheduler.load_state_dict(saved["optim"]["scheduler"])
        ckpt.set_rng_state(saved["rng"], self.par.ranks.rank)
        meta = saved["meta"]
        self.step = meta["step"]
        self.tokens_seen = meta.get("tokens_seen", 0)  # checkpoints before it was kept: counted from 0
        n_rng = len(saved["rng"].get("ranks") or [None])  # the ranks whose RNG states the checkpoint holds
        self.pos, self.resume_note = self.par.resume(meta, len(self.train_set), n_rng)
        # Restored with the scheduler. A changed length (max_steps, epochs) or a dropped time
        # budget re-aims the curve at total_steps from here, without a jump.
        if self.schedule.end > self.total_steps or (t.max_time_s is None and self.schedule.end != self.total_steps):
            self.schedule.refit(self.step, self.total_steps)

    # ------------------------------------------------------------------ one micro-batch
    def supervise(self, micro: Iterable[list[Example]]) -> Iterator[tuple[Batch, Any]]:
        """(batch, supervision of the family's kind) per micro-batch, in order.

        A remote engine computes supervision server-side with prefetch_depth requests in flight
        (full-vocab logits never cross the wire); co-located engines run features + contract here.
        """
        batches = (collate(examples, self.pad_id) for examples in micro)
        return self.engine.supervision(self.family.SUPERVISION, batches, self.aux_ids)

    def forward(self, examples: list[Example], supervised: Optional[tuple[Batch, Any]] = None,
                generators: Optional[list[torch.Generator]] = None):
        """Supervision for ``examples`` -> one draft forward -> (output with .loss and .sums, real tokens).

        ``supervised`` is the (batch, supervision) pair :meth:`supervise` made for ``examples``
        (computed here when None); ``generators``: one per row for the family's training draws.
        """
        batch, sup = supervised if supervised is not None else next(iter(self.supervise([examples])))
        sup = supervision_to(sup, self.device)  # a no-op when the engine delivered on the draft's device
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            out = self.model(sup, generators)  # draft.supervised, through DDP / FSDP2 when wrapped
        return out, int(batch.attention_mask.sum())

    def row_generators(self, rows: list[int], epoch: Optional[int] = None) -> list[torch.Generator]:
        """One generator per conversation, seeded by (train.seed, epoch, conversation); ``epoch``
        defaults to the current one (held-out draws use -1: the same at every evaluation)."""
        epoch = self.pos.epoch if epoch is None else epoch
        return [torch.Generator().manual_seed(parallel.row_seed(self.cfg.train.seed, epoch, i)) for i in rows]

    def train_window(self, window: list[list[Example]], sups: Optional[Iterator[tuple[Batch, Any]]] = None,
                     weights: Optional[list[float]] = None,
                     generators: Optional[list[Optional[list[torch.Generator]]]] = None) -> dict:
        """One optimizer step over ``window`` (up to grad_accum micro-batches of this rank).

        Each micro-batch's loss is weighted 1/len(window), so a trailing partial window (fewer than
        grad_accum micro-batches at the end of an epoch) is flushed with the same scale as a single
        batch holding its rows. ``sups`` yields the window's (batch, supervision) pairs in order
        (:meth:`supervise`); ``weights`` (1 or 0 per micro-batch: :func:`parallel.rank_share`) and
        ``generators`` (per micro-batch, one per row) default to 1 and None. Returns the loss, the real
        tokens and the family's metric sums over the window, all ranks together."""
        t = self.cfg.train
        self.model.train()
        if hasattr(self.draft, "set_progress"):  # a loss schedule over optimizer steps (Domino)
            self.draft.set_progress(self.step, self.total_steps)
        loss, tokens, sums = 0.0, 0, None
        for i, examples in enumerate(window):
            weight = 1.0 if weights is None else weights[i]
            # gradients are reduced over ranks in the window's last backward only
            with parallel.grad_sync(self.model, sync=i == len(window) - 1):
                out, n_tok = self.forward(examples, next(sups) if sups is not None else None,
                                          generators[i] if generators is not None else None)
                grad_loss, value = self.par.loss(out, weight)
                (grad_loss / len(window)).backward()
            tokens += n_tok if weight else 0
            loss += value / len(window)
            sums = add_sums(sums, {k: v * int(weight) for k, v in out.sums.items()})
        sums, tokens = self.par.reduce(sums, tokens)
        if t.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad], t.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"loss": loss, "tokens": tokens, "sums": sums}

    # ------------------------------------------------------------------ loop
    def run(self) -> TrainResult:
        from draftsmith.train.progress import TrainBar

        t, pos = self.cfg.train, self.pos
        start, start_step = time.perf_counter(), self.step
        tokens, history, last_ckpt, eval_metrics = 0, [], None, {}
        bar = TrainBar(self.total_steps, self.step, max_time_s=t.max_time_s, disable=not self.progress, desc="train",
                       unit="step")
        stop = self.step >= self.total_steps
        while pos.epoch < t.epochs and not stop:
            order = epoch_order(len(self.train_set), pos.epoch, t.seed)
            if t.group_by_length:
                order = length_grouped(order, [len(ex.input_ids) for ex in self.train_set], pos.group_batch)
            # global micro-batches from where this epoch stands; this rank's share of each
            mbs = self.par.global_batches(order[pos.row_pos :])
            shares = [self.par.share(rows) for rows in mbs]
            sups = self.supervise([self.train_set[i] for i in rows] for rows, _ in shares)
            done = 0  # micro-batches of mbs done
            while done < len(mbs) and not stop:
                # A window of grad_accum micro-batches; the trailing partial window is flushed
                # with each micro-batch weighted 1/len(window), so it equals one batch of its rows.
                window = shares[done : done + t.grad_accum]
                stats = self.train_window([[self.train_set[i] for i in rows] for rows, _ in window], sups,
                                          [w for _, w in window], [self.row_generators(rows) for rows, _ in window])
                tokens += stats["tokens"]
                self.tokens_seen += stats["tokens"]
                loss_sum = stats["loss"]
                summary = self.family.summarize(stats["sums"])
                scalars = self.family.scalars(summary)
                self.step += 1
                pos.advance(mbs[done : done + len(window)])
                done += len(window)
                history.append((self.step, loss_sum))
                elapsed = self.elapsed(start)
                stop = self.step >= self.total_steps or (t.max_time_s is not None and elapsed >= t.max_time_s)
                if t.max_time_s is not None and not stop:
                    self.fit_schedule(elapsed, self.step - start_step)
                # under a budget, the bar's total is where it stops the run, and ends full when it does
                bar.step(self.step, elapsed, stop)
                bar.set_postfix(loss=f"{loss_sum:.3f}", **{k: f"{scalars[v]:.3f}" for k, v in self.family.PROGRESS.items()},
                                tok_s=f"{tokens / max(elapsed, 1e-9):.0f}")
                if self.writer is not None and (self.step % max(t.log_every, 1) == 0 or self.step == 1):
                    self.writer.add_scalar("train/loss", loss_sum, self.step)
                    for name, value in scalars.items():
                        self.writer.add_scalar(f"train/{name}", value, self.step)
                    self.writer.add_scalar("train/lr", self.scheduler.get_last_lr()[0], self.step)
                    self.writer.add_scalar("train/tokens_per_s", tokens / max(elapsed, 1e-9), self.step)
                # ---------------------------------------------------------- eval, save (periodic)
                if t.eval_every and self.step % t.eval_every == 0 and not stop:
                    eval_metrics = self.evaluate()
                if t.save_every and self.step % t.save_every == 0 and not stop:
                    last_ckpt = self.save()
                if t.spec_eval_every and self.step % t.spec_eval_every == 0 and not stop:
                    self.spec_eval(summary.get("simulated_tau"))
            sups.close()  # an early stop abandons prefetched requests
            if done >= len(mbs):
                pos.next_epoch(self.par.global_batch)
        bar.close()
        wall = time.perf_counter() - start
        # -------------------------------------------------------------- final eval, save
        eval_metrics = self.evaluate()
        if t.spec_eval_every:
            eval_metrics.update(self.spec_eval(eval_metrics.get("simulated_tau")))
        last_ckpt = self.save()
        if self.writer is not None:
            self.writer.close()
        return TrainResult(self.out, last_ckpt, self.step, pos.epoch, tokens, wall, tokens / max(wall, 1e-9),
                           eval_metrics, history)

    def elapsed(self, start: float) -> float:
        """Seconds since ``start``; under train.max_time_s the largest over ranks, so every rank takes
        the same stop and LR decisions (a rank that stopped alone would hang the others)."""
        elapsed = time.perf_counter() - start
        return self.par.slowest(elapsed) if self.cfg.train.max_time_s is not None else elapsed

    def spec_eval(self, simulated: Optional[float]) -> dict:
        """Real speculative decoding on held-out prompts (eval/offline.py), on rank 0 with the whole
        draft (FSDP2 is refused at setup); the other ranks wait for it."""
        from draftsmith.eval.offline import trainer_spec_eval  # real tau next to simulated tau

        return self.par.on_main(lambda: trainer_spec_eval(self, simulated=simulated), default={})

    def describe(self) -> list[str]:
        """What setup found, printed before training by ``train`` and ``demo``: the data report
        (rows kept, bad rows by reason), the split, the draft vocab, the aux layers and the budget."""
        t = self.cfg.train
        n_convs = len(self.train_set) + len(self.eval_set) + self.dropped
        lines = [self.data_report.summary()]
        lines += [f"data: first {kind!r}: {msg}" for kind, msg in list(self.data_report.first_errors.items())[:3]]
        if self.dropped:
            lines.append(f"data: {self.dropped} of {n_convs} conversations dropped (no assistant token within "
                         f"data.max_length={self.cfg.data.max_length})")
        lines.append(f"setup: {len(self.train_set)} train / {len(self.eval_set)} held-out conversations, draft vocab "
                     f"{self.vocab.draft_ids.numel()} of {self.info.vocab_size} (coverage {self.vocab.coverage:.3f} train"
                     + (f", {self.held_out_coverage:.3f} held-out" if self.held_out_coverage is not None else "") + "), "
                     f"aux layers {self.aux_ids}; {self.held_out_from}")
        steps = (f"{self.total_steps} steps ({self.steps_per_epoch}/epoch x {t.epochs} epochs"
                 + (f", capped by train.max_steps={t.max_steps})" if t.max_steps is not None else ")"))
        start = f" from step {self.step}" if self.step else ""
        if t.max_time_s is not None:
            lines.append(f"budget: up to {t.max_time_s:.0f} s of training (train.max_time_s), at most {steps}{start}")
        else:
            lines.append(f"budget: {steps}{start}")
        lines.append(self.par.describe(t.grad_accum, self.bf16))
        if self.resume_note:
            lines.append(self.resume_note)
        return lines

    def data_order(self) -> dict:
        """What fixes the order of micro-batches (checked on resume)."""
        t = self.cfg.train
        return {"train.seed": t.seed, "train.group_by_length": t.group_by_length, "train conversations": len(self.train_set)}

    def fit_schedule(self, elapsed: float, done: int, every: int = 25) -> None:
        """End the cosine at the step train.max_time_s is expected to stop at (re-estimated every
        ``every`` steps from the measured step time, never beyond total_steps)."""
        t = self.cfg.train
        if done % every or self.step <= t.warmup_steps:
            return
        self.schedule.refit(self.step, reachable_step(self.step, self.total_steps, t.max_time_s, elapsed, done))

    # ------------------------------------------------------------------ eval
    @torch.no_grad()
    def evaluate(self) -> dict:
        """Held-out loss (mean over global micro-batches) and the family's summary of its metric sums
        over the whole split (EAGLE-3: per-step accuracy, simulated tau, positions), all ranks together."""
        if not self.eval_set:
            return {}
        if hasattr(self.draft, "set_progress"):  # a step-dependent loss (Domino): the held-out loss at this step,
            self.draft.set_progress(self.step, self.total_steps)  # the same whether or not the run was resumed
        self.model.eval()
        t = self.cfg.train
        sums, loss_sum, n = None, 0.0, 0
        batches = self.par.global_batches(list(range(len(self.eval_set))))[: t.eval_max_batches]
        shares = [self.par.share(rows) for rows in batches]
        if not shares:  # train.eval_max_batches: 0
            return {}
        micro = [[self.eval_set[i] for i in rows] for rows, _ in shares]
        for (examples, supervised), (rows, weight) in zip(zip(micro, self.supervise(micro)), shares):
            # held-out draws (DFlash anchors) keyed by the conversation: the same at every evaluation,
            # whatever the batch or the number of ranks
            out, _ = self.forward(examples, supervised, self.row_generators(rows, epoch=-1))
            sums = add_sums(sums, {k: v.float() * weight for k, v in out.sums.items()})
            loss_sum += self.par.loss(out, weight)[1]
            n += 1
        sums, _ = self.par.reduce(sums, 0)
        metrics = {"loss": loss_sum / max(n, 1), **self.family.summarize(sums)}
        if self.held_out_coverage is not None:  # the whole split's, next to metrics that count its misses
            metrics["draft_vocab_coverage"] = self.held_out_coverage
        if self.writer is not None:
            self.writer.add_scalar("eval/loss", metrics["loss"], self.step)
            for name, value in self.family.scalars(metrics).items():
                self.writer.add_scalar(f"eval/{name}", value, self.step)
        return metrics

    # ------------------------------------------------------------------ save
    def save(self) -> Path:
        """A checkpoint of the whole run: every rank gathers (FSDP2 shards, RNG states), rank 0 writes,
        all wait for the write, so no rank runs ahead of a checkpoint that may yet fail."""
        model_state, optim_state = parallel.full_state(self.model, self.draft, self.optimizer)
        rng_states = self.par.all_gather(ckpt.rng_state())
        vocab = {"draft_ids": self.vocab.draft_ids.to(torch.int64), "d2t": self.vocab.d2t.to(torch.int64),
                 "t2d": self.vocab.t2d.to(torch.bool)}
        meta = {
            **self.par.position_meta(self.pos),  # where the data order resumes, whatever the ranks then
            "data_order": self.data_order(),
            "total_steps": self.total_steps,
            "tokens_seen": self.tokens_seen,  # x of a tau-vs-training-tokens curve (bench/tau_curve.py)
            "aux_layer_ids": self.aux_ids,
            "target": self.cfg.target.path,
            "target_info": self.info.to_dict(),
            "vocab_fingerprint": self.vocab.fingerprint,
            "vocab_coverage": self.vocab.coverage,
            "draft_type": self.cfg.draft.type,
            "chat_template_kwargs": self.template_kwargs,  # eval and serve render prompts with these
        }
        if hasattr(self.family, "checkpoint_meta"):  # the family's own facts (DFlash: block size, mask token, ids)
            meta.update(self.family.checkpoint_meta(self.draft))
        self.par.on_main(lambda: ckpt.save_checkpoint(
            self.ckpt_root, self.pos.name_epoch, self.step,
            model_state=model_state,
            model_config=self.draft.export_config(self.aux_ids, torch_dtype="float32"),
            vocab=vocab,
            optim_state={"optimizer": optim_state, "scheduler": self.scheduler.state_dict()},
            meta=meta,
            run_config_yaml=dump_config(self.cfg),
            rng_states=rng_states,
        ))
        return self.ckpt_root / ckpt.checkpoint_name(self.pos.name_epoch, self.step)


def train(cfg: RunConfig, *, resume: Optional[str | Path] = None, progress: bool = True,
          announce: Optional[Callable[[str], None]] = None) -> TrainResult:
    """Train a draft of family ``draft.type`` as ``cfg`` says; see :class:`Trainer`. ``announce`` gets
    the setup summary (:meth:`Trainer.describe`) one line at a time before the loop starts."""
    trainer = Trainer(cfg, resume=resume, progress=progress)
    try:
        if announce and trainer.par.main:
            note = aux_order_note(cfg)  # the ids in meta.json and the export differ from the config's: say why
            for line in ([note] if note else []) + trainer.describe():
                announce(line)
        return trainer.run()
    finally:
        trainer.engine.close()
        trainer.par.close()
