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

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import torch

from draftsmith.config import ConfigError, RunConfig, dump_config
from draftsmith.data.dataset import Example, collate, epoch_order, length_grouped
from draftsmith.data.sources import iter_rows
from draftsmith.data.vocab_cache import VocabMap, draft_vocab_for, held_out_coverage
from draftsmith.drafts import get_family
from draftsmith.inputs import (aux_layer_ids, aux_order_note, check_target_rope, engine_options, resolve_template_kwargs,
                               split_rows)
from draftsmith.targets import Batch, TargetInfo, check_engine, open_engine
from draftsmith.targets.contract import TargetError, supervision_kind, supervision_tensors, supervision_to
from draftsmith.targets.runner import decoder_layer_weights
from draftsmith.train import checkpoint as ckpt
from draftsmith.train import held_out, packing, parallel
from draftsmith.train.held_out import Best, add_sums
from draftsmith.train.malloc import fix_malloc
from draftsmith.train.optim import build_optimizer
from draftsmith.train.progress import TrainBar, setup_lines
from draftsmith.train.scalars import check_wandb, open_scalars
from draftsmith.train.schedule import Cosine, reachable_step


@dataclass
class TrainResult:
    """What :func:`train` returns: where the run wrote, how far it got, its speed and final metrics."""

    output_dir: Path
    checkpoint: Optional[Path]
    step: int
    epoch: int
    tokens: int  # real (non-pad) tokens the draft trained on in this run, all ranks together
    wall_s: float
    tokens_per_s: float
    eval: dict = field(default_factory=dict)
    history: list = field(default_factory=list)  # (step, loss) per optimizer step
    padding: float = 0.0  # share of the draft's positions that were padding in this run (this rank's)
    best: Optional[Best] = None  # train.keep_best / early_stop_patience: the best held-out score and its checkpoint


def build_draft(cfg: RunConfig, info: TargetInfo, vocab: VocabMap, layer_ids: list[int]):
    """A fresh draft of family ``draft.type`` for this target, over the selected draft vocab, reading
    the target's ``layer_ids`` (engine convention)."""
    family = get_family(cfg.draft.type)
    check_target_rope(info)  # a RoPE the draft cannot copy: one line, not the model constructor's traceback
    try:  # values only checkable against the target (e.g. mask_token_id within its vocab)
        config = family.config_from_target(info, cfg.draft, draft_vocab_size=int(vocab.draft_ids.numel()),
                                           num_layer_ids=len(layer_ids), layer_ids=list(layer_ids))
    except ValueError as e:
        raise ConfigError([f"draft.{e}"]) from None
    return family.Model(config)


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
        if self.device.type == "cpu":
            fix_malloc()  # the resident set follows the live tensors (train/malloc.py: why, and the figures)
        torch.manual_seed(cfg.train.seed)  # the same on every rank: every rank builds the same draft
        self.out = Path(cfg.output.dir)
        self.ckpt_root = self.out / "checkpoints"
        self.resumed_from = ckpt.resolve_resume(Path(resume)) if resume else None
        saved = ckpt.load_checkpoint(self.resumed_from) if self.resumed_from else None  # fail before heavy work
        if saved is not None:
            ckpt.check_family(saved, self.resumed_from, cfg.draft.type)
        check_engine(cfg.target.engine)  # an engine that cannot run here fails now, with the reason
        check_wandb(cfg.output)  # output.wandb without the package: the install hint now
        for spec in cfg.data.sources + cfg.data.eval_sources:
            iter_rows(spec)  # a missing file or unknown built-in fails now, not after the target loads
        self._open_engine()
        self._load_data()
        self._build_vocab(saved)
        self._build_draft()
        self.resume_note = None
        self.best = Best.start(cfg.train, saved["meta"] if saved is not None else None)  # train/held_out.py
        if saved is not None:  # the weights, once the data order and the draft's config are checked against this run
            ckpt.check_resumable(saved, self.resumed_from, self.data_order(),
                                 self.draft.export_config(self.aux_ids, "float32"), cfg.train.optimizer)
            self.draft.load_state_dict(saved["model_state"])
        # DDP / FSDP2 around the draft (one rank: the plain draft); the optimizer sees the wrapped parameters
        self.model = self.par.wrap(self.draft)
        self._build_optimizer()
        if saved is not None:
            self._restore(saved)
        self.padding = self._padding()
        # TensorBoard and/or W&B (train/scalars.py), rank 0's: one add_scalar reaches both
        self.writer = (open_scalars(cfg.output, self.out, cfg.to_dict(), resumed=self.resumed_from is not None)
                       if self.par.main else None)
        if self.writer is not None:
            self.writer.add_scalar("data/padding_unpacked", self.padding.unpacked_fraction, self.step)
            self.writer.add_scalar("data/padding_packed", self.padding.packed_fraction, self.step)

    # ------------------------------------------------------------------ setup steps
    def _open_engine(self) -> None:
        """The target's engine, its info, the layer ids the draft reads and the tokenizer."""
        from transformers import AutoTokenizer

        from draftsmith.models import resolve_target

        cfg = self.cfg
        # the remote engine needs it for the tokenizer only (and draft.init_layer_from_target for one layer's weights)
        self.target_path = target_path = resolve_target(cfg.target.path)
        check_target_rope(target_path)  # before the engine loads the weights
        self.engine = open_engine(cfg.target.engine, target_path, dtype=cfg.target.dtype, device=str(self.device),
                                  **engine_options(cfg))
        self.info = self.engine.info()
        self.aux_ids = aux_layer_ids(cfg, self.info.num_layers)
        self.tokenizer = AutoTokenizer.from_pretrained(target_path)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def _load_data(self) -> None:
        """Conversations -> rendered examples -> train / held-out split (draftsmith/inputs.py)."""
        self.template_kwargs = resolve_template_kwargs(self.cfg)  # saved in meta.json: serving renders alike
        rows = split_rows(self.cfg, self.tokenizer)
        self.train_set, self.eval_set, self.data_report, self.dropped = rows.train, rows.held_out, rows.report, rows.dropped
        self.held_out_from = rows.held_out_from

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
        # the train split's coverage flatters the vocab chosen on it: the held-out split's is reported beside it
        self.held_out_coverage = held_out_coverage(self.eval_set, self.vocab.draft_ids, self.info.vocab_size)

    def _build_draft(self) -> None:
        """A fresh draft, given what it takes from the target (embeddings; lm_head + final norm if asked)."""
        self.draft = build_draft(self.cfg, self.info, self.vocab, self.aux_ids)
        if hasattr(self.draft, "activation_checkpointing"):  # a memory knob of multi-layer drafts, not their math
            self.draft.activation_checkpointing = self.cfg.train.activation_checkpointing
        info = self.info
        try:  # a target whose weights do not fit the draft: one line naming the key, not a traceback
            self.family.attach_target(self.draft, self.cfg.draft, embeddings=self.engine.embeddings(),
                                      # a (1 + w) final norm (Gemma) is the plain norm of weight w + 1, which the draft's norm is
                                      head=lambda: (self.engine.lm_head_weight(), self.engine.final_norm_weight() + info.norm_offset),
                                      vocab=self.vocab,
                                      layer=lambda i: decoder_layer_weights(self.target_path, i, info))
        except (ValueError, TargetError) as e:
            raise ConfigError([str(e)]) from None
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
        # warmup_fraction as AutoModel counts its warmup_ratio: max(1, int(ratio x total)) steps
        warmup = t.warmup_steps if t.warmup_fraction is None else max(1, int(t.warmup_fraction * self.total_steps))
        self.schedule = Cosine(warmup, self.total_steps, t.min_lr_ratio)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.schedule)
        self.step = 0
        self.pos = parallel.Position(group_batch=global_batch)  # where the data order stands
        self.positions = [0, 0]  # this rank's (real, computed) draft positions trained on in this process
        self.tokens_seen = 0  # real tokens trained on since step 0, all ranks, across resumes

    def _restore(self, saved: dict) -> None:
        """Optimizer, scheduler, this rank's RNG and the data position from a checkpoint."""
        t = self.cfg.train
        parallel.load_optimizer(self.model, self.optimizer, saved["optim"]["optimizer"])  # kind checked at setup
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

    def _padding(self, most: int = 4096) -> packing.Padding:
        """The draft's positions over epoch 0's first ``most`` micro-batches (all ranks' shares: the global
        order cut by train.batch_size), unpacked and packed into rows of data.max_length (setup line;
        ``most`` bounds its cost on a large corpus to about a second)."""
        lengths = [len(ex.input_ids) for ex in self.train_set]
        order = self.order_of(0, self.par.global_batch)
        batches = parallel.micro_batches(order, self.cfg.train.batch_size)[:most]
        return packing.padding(([lengths[i] for i in rows] for rows in batches), self.cfg.data.max_length)

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
        """Supervision for ``examples`` -> one draft forward -> (output with .loss and .sums, real tokens,
        the draft's positions, padding included).

        ``supervised`` is the (batch, supervision) pair :meth:`supervise` made for ``examples``
        (computed here when None); ``generators``: one per row for the family's training draws.
        With data.packing the supervision's rows are packed first (train/packing.py): same loss, fewer rows.
        """
        batch, sup = supervised if supervised is not None else next(iter(self.supervise([examples])))
        sup = supervision_to(sup, self.device)  # a no-op when the engine delivered on the draft's device
        if self.cfg.data.packing:  # config.py let it through for a family whose description says packing
            sup = packing.pack(sup, batch.attention_mask.sum(1).tolist(), self.cfg.data.max_length)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            out = self.model(sup, generators)  # draft.supervised, through DDP / FSDP2 when wrapped
        # the draft's (rows x length) positions: every kind's tensors lead with (B, S), whatever it names them
        return out, int(batch.attention_mask.sum()), next(iter(supervision_tensors(sup).values())).shape[:2].numel()

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
        if hasattr(self.draft, "set_progress"):  # a schedule over optimizer steps (Domino's loss, EAGLE-3's depth)
            self.draft.set_progress(self.step, self.schedule.end)
        loss, tokens, sums = 0.0, 0, None
        for i, examples in enumerate(window):
            weight = 1.0 if weights is None else weights[i]
            # gradients are reduced over ranks in the window's last backward only
            with parallel.grad_sync(self.model, sync=i == len(window) - 1):
                out, n_tok, n_pos = self.forward(examples, next(sups) if sups is not None else None,
                                                 generators[i] if generators is not None else None)
                grad_loss, value = self.par.loss(out, weight)
                (grad_loss / len(window)).backward()
            tokens += n_tok if weight else 0
            if weight:  # this rank's real and computed draft positions (TrainResult.padding)
                self.positions[0] += n_tok
                self.positions[1] += n_pos
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
        """The whole training job from where setup left it: the loop, then a final eval and save."""
        t, pos = self.cfg.train, self.pos
        start, start_step = time.perf_counter(), self.step
        tokens, history, last_ckpt, eval_metrics = 0, [], None, {}
        saved_at = evaluated_at = None  # the steps of the last checkpoint written and evaluation made in this loop
        bar = TrainBar(self.total_steps, self.step, max_time_s=t.max_time_s, disable=not self.progress, desc="train",
                       unit="step")
        stop = self.step >= self.total_steps
        while pos.epoch < t.epochs and not stop:
            order = self.order_of(pos.epoch, pos.group_batch)
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
                    self.writer.add_scalar("train/padding", packing.Padding.fraction(*self.positions), self.step)
                # ---------------------------------------------------------- eval, save (periodic)
                if t.eval_every and self.step % t.eval_every == 0 and not stop:
                    eval_metrics, evaluated_at = self.evaluate(), self.step
                    if self.best.update(eval_metrics, self.step) and self.best.keep:
                        last_ckpt, saved_at = self.save_best(), self.step
                    stop = self.best.exhausted  # train.early_stop_patience evaluations without a better one
                if t.save_every and self.step % t.save_every == 0 and not stop:
                    last_ckpt = self.save()
                    saved_at = self.step
                if t.spec_eval_every and self.step % t.spec_eval_every == 0 and not stop:
                    self.spec_eval(summary.get("simulated_tau"))
            sups.close()  # an early stop abandons prefetched requests
            if done >= len(mbs):
                pos.next_epoch(self.par.global_batch)
                # train.save_every_epoch: epoch_<E>_step_<S> at the epoch's end, resuming at the next epoch's
                # start; not after the last epoch or a stop (the final save below is that checkpoint), nor
                # twice for a step save_every just saved
                if t.save_every_epoch and not stop and pos.epoch < t.epochs and saved_at != self.step:
                    last_ckpt = self.save()
                    saved_at = self.step
        bar.close()
        wall = time.perf_counter() - start
        # -------------------------------------------------------------- final eval, save
        improved = False
        if evaluated_at != self.step:  # not when early stopping has just evaluated this step
            eval_metrics = self.evaluate()
            improved = self.best.update(eval_metrics, self.step)
        if t.spec_eval_every:
            eval_metrics.update(self.spec_eval(eval_metrics.get("simulated_tau")))
        if improved and self.best.keep:
            last_ckpt = self.save_best()
        elif saved_at != self.step:
            last_ckpt = self.save()
        if self.writer is not None:
            self.writer.close()
        return TrainResult(self.out, last_ckpt, self.step, pos.epoch, tokens, wall, tokens / max(wall, 1e-9),
                           eval_metrics, history, packing.Padding.fraction(*self.positions),
                           self.best if self.best.active else None)

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
        """What setup found, printed before training by ``train`` and ``demo`` (:func:`progress.setup_lines`)."""
        return setup_lines(self)

    def order_of(self, epoch: int, group_batch: int) -> list[int]:
        """The order of the training conversations in ``epoch`` (length-grouped by ``group_batch`` with
        train.group_by_length): a function of the seed and the epoch only, so a resume recomputes it."""
        t = self.cfg.train
        order = epoch_order(len(self.train_set), epoch, t.seed)
        if t.group_by_length:
            order = length_grouped(order, [len(ex.input_ids) for ex in self.train_set], group_batch)
        return order

    def data_order(self) -> dict:
        """What fixes the order of micro-batches (checked on resume)."""
        t = self.cfg.train
        return {"train.seed": t.seed, "train.group_by_length": t.group_by_length, "train conversations": len(self.train_set)}

    def fit_schedule(self, elapsed: float, done: int, every: int = 25) -> None:
        """End the cosine at the step train.max_time_s is expected to stop at (re-estimated every
        ``every`` steps from the measured step time, never beyond total_steps)."""
        t = self.cfg.train
        if done % every or self.step <= self.schedule.warmup:
            return
        self.schedule.refit(self.step, reachable_step(self.step, self.total_steps, t.max_time_s, elapsed, done))

    # ------------------------------------------------------------------ eval
    def evaluate(self) -> dict:
        """Held-out loss and the family's metric summary over the whole split, all ranks together
        (train/held_out.py), written to the scalars."""
        return held_out.evaluate(self)

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
            "best": self.best.meta(),  # train.keep_best / early_stop_patience carry on across a resume
        }
        if self.family.checkpoint_meta is not None:  # the family's own facts (DFlash: block size, mask token, ids)
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


    def save_best(self) -> Path:
        """Save this step's checkpoint as the new best (its meta.json says so) and point ``BEST`` at it."""
        name = ckpt.checkpoint_name(self.pos.name_epoch, self.step)
        self.best.checkpoint = str(self.ckpt_root / name)
        path = self.save()
        self.par.on_main(lambda: ckpt.point(self.ckpt_root, "BEST", name))
        return path


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
