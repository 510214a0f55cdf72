"""PyTorch Lightning → ``metrics.jsonl``: a ``Logger`` that is also the ``Callback`` it needs.

    from metrics_core.integrations.lightning import MetricsLogger

    logger = MetricsLogger("runs/my-run")
    checkpoints = ModelCheckpoint("checkpoints/my-run", every_n_train_steps=1000, save_last=True)
    trainer = Trainer(logger=logger, callbacks=[logger, checkpoints], ...)   # as both (see below)
    trainer.fit(model, ckpt_path="last")         # resumes, or starts fresh when there is no last.ckpt

    # in the LightningModule, for the exact token-weighted loss (no self.log needed):
    def training_step(self, batch, batch_idx):
        ...
        return {"loss": loss, "tokens": tokens}     # tokens: label tokens behind this mean loss
    def validation_step(self, batch, batch_idx):
        ...
        self.log("val_loss", loss)
        return {"loss": loss, "tokens": tokens}

Why it is also a callback: a Lightning logger is never handed the trainer, and
``log_hyperparams`` runs before the checkpoint's training state is restored, so a logger alone
cannot know the step a run resumed from.  As a callback it opens the session in
``on_train_start``, after ``ckpt_path`` was loaded, and keeps its counters in the checkpoint
(``state_dict`` / ``load_state_dict``).  Passed only as ``logger=``, it still works, opening the
session at the first ``log_metrics`` with ``resumed_from_step`` unknown (None) and counters that
restart.

Records
-------
* ``session_start`` (``discarded_bytes``, ``resumed_from_step``: the restored ``global_step`` when
  ``fit`` got a ``ckpt_path``), then the hyperparameters given to ``log_hyperparams``
  (``save_hyperparameters()``) as one ``config`` record.
* ``train`` at each of Lightning's logging steps (``log_every_n_steps``).  When
  ``training_step`` returns ``{"loss", "tokens"}`` the record is a ``TrainingWindow`` summary over
  every optimizer step since the last record (``train_loss`` = summed token loss / tokens,
  ``tokens``, ``attempted_updates``, ``updates``; ``loss_weighting: "tokens"``): Lightning itself
  logs, for ``on_step`` metrics, only the value of the logging step, not the window.  The
  module's own logged values are kept beside it (a logged ``train_loss`` becomes
  ``logged_train_loss``).  Lightning calls ``log_metrics`` only when the module logged something,
  right after ``on_train_batch_end``; when it does not, the window is written by the next hook
  (``on_train_batch_start``, ``on_validation_start``, ``on_train_epoch_end`` or ``finalize``),
  at its logging step.  Without ``tokens`` the record holds the logged values
  (``loss_weighting: "logged"``).  ``lr`` is the first optimizer's first param group's.
* ``validation`` for logged keys starting with ``val``; with ``{"loss", "tokens"}`` from
  ``validation_step``, ``val_loss`` / ``val_tokens`` are token-weighted over the whole validation
  run (the epoch-mean Lightning logs weights batches, not tokens: kept as ``logged_val_loss``).
  Sanity-check batches are ignored.
* ``checkpoint`` after each save (``after_save_checkpoint``), with the file as ``path`` and the
  ``tokens_seen`` saved in it: every completed step's, also those not yet in a train record
  (``ModelCheckpoint`` saves in ``on_train_batch_end``, before Lightning logs that step).
* ``session_end`` from ``finalize``: ``success`` → ``finished``; ``failed`` → ``interrupted`` for
  KeyboardInterrupt or Lightning's SIGTERM exit, else ``failed`` with the exception (Lightning calls
  ``finalize`` inside its ``except`` block, so the exception is read from ``sys.exc_info()``).

``step`` is ``trainer.global_step`` (optimizer steps; an AMP step skipped on overflow is not told
apart: ``skipped_updates`` stays 0).  Loss and token counts are kept as tensors until a record
is written: one device→host transfer per logging window.  Only global rank 0 writes.  Each
``fit`` / ``validate`` / ``test`` call ends in ``finalize``, so each is its own session.
"""

from __future__ import annotations

import os
import sys
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException

from metrics_core.integrations._common import RunSession, scalars
from metrics_core.write.session_end import Terminated
from metrics_core.write.window import TrainingWindow

Number = torch.Tensor | int | float


class MetricsLogger(Logger, Callback):
    """Writes a Lightning run to ``directory/metrics.jsonl``; see the module docstring."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        run_id: str | None = None,
        fsync: bool = False,
        system_metrics: bool = True,
    ) -> None:
        super().__init__()
        self.run = RunSession(directory, run_id=run_id, fsync=fsync, system_metrics=system_metrics)
        self.tokens_seen = 0
        self.window = TrainingWindow()
        self._trainer: Trainer | None = None
        self._config: dict[str, Any] | None = None
        self._micro: list[tuple[Number, Number]] = []  # (loss sum, tokens) since the last optimizer step
        self._steps: list[tuple[Number, Number]] = []  # per optimizer step, since the last train record
        self._val: list[tuple[Number, Number]] = []
        self._seen_step = 0
        self._due: int | None = None  # the logging step that closed the window in _steps, until written

    # -- Logger ---------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return "metrics_core"

    @property
    def version(self) -> str:
        return self.run.run_id

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        self._config = dict(vars(params) if isinstance(params, Namespace) else params)
        if self.run.is_open:
            self.run.write_config(self._config)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        if not self.run.is_open:  # not registered as a callback, or validate()/test() only
            self.run.state.step = step or 0
            self._start(resumed_from_step=None)
        self._sync_counters(step)
        epoch = metrics.get("epoch")
        validation = {key: value for key, value in metrics.items() if key.startswith("val")}
        train = {key: value for key, value in metrics.items() if key != "epoch" and key not in validation}
        if train or self._steps:
            self._log_train(train, epoch)
        if validation:
            self._log_validation(validation, epoch)

    @rank_zero_only
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        path = getattr(checkpoint_callback, "_last_checkpoint_saved", None) or getattr(
            checkpoint_callback, "last_model_path", None
        )
        if self.run.is_open:
            self._sync_counters(None)
            self.run.state.tokens_seen = self._counted_tokens()
            self.run.write("checkpoint", **({"path": os.fspath(path)} if path else {}))

    @rank_zero_only
    def finalize(self, status: str) -> None:
        if not self.run.is_open:
            return
        exc: BaseException | None = None
        if status == "failed":
            exc = sys.exc_info()[1] or RuntimeError("Lightning reported the run as failed")
            if isinstance(exc, SIGTERMException):
                exc = Terminated()
        self._write_due_window()
        self._sync_counters(None)
        self.run.state.tokens_seen = self._counted_tokens()
        self.run.end(exc)
        self._micro, self._steps, self._val, self._due = [], [], [], None

    # -- Callback -------------------------------------------------------------------------------------
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._trainer = trainer

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._trainer = trainer
        if not trainer.is_global_zero or self.run.is_open:
            return
        self._seen_step = trainer.global_step
        self._sync_counters(None)
        self._start(resumed_from_step=trainer.global_step if trainer.ckpt_path else None)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.run.is_open:
            return
        if isinstance(outputs, Mapping) and "tokens" in outputs and outputs.get("loss") is not None:
            # Lightning hands back the loss divided by accumulate_grad_batches (what it backpropagates).
            loss = outputs["loss"].detach() * trainer.accumulate_grad_batches
            self._micro.append((loss * outputs["tokens"], outputs["tokens"]))
        if trainer.global_step != self._seen_step:  # an optimizer step completed with this batch
            self._seen_step = trainer.global_step
            if self._micro:
                self._steps.append((sum(s for s, _ in self._micro), sum(t for _, t in self._micro)))
            self._micro = []
            if self._steps and _logs_this_step(trainer):
                self._due = trainer.global_step

    # The hooks that can run first after a logging step's log_metrics (see the module docstring).
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._write_due_window()

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._write_due_window()

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._write_due_window()

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self.run.is_open and not trainer.sanity_checking and isinstance(outputs, Mapping) and "tokens" in outputs:
            loss = outputs["loss"].detach()
            self._val.append((loss * outputs["tokens"], outputs["tokens"]))

    def state_dict(self) -> dict[str, Any]:
        """Saved in every checkpoint: the counters a resumed session continues from."""
        return {"tokens_seen": self._counted_tokens()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.tokens_seen = int(state_dict.get("tokens_seen", 0))

    # -- records --------------------------------------------------------------------------------------
    def _start(self, resumed_from_step: int | None) -> None:
        self.run.start(resumed_from_step, self._config)

    def _counted_tokens(self) -> int:
        """Tokens of every completed optimizer step, written or not: one device→host transfer."""
        return self.tokens_seen + int(sum(_fold([t for _, t in self._steps])))

    def _write_due_window(self) -> None:
        """The window Lightning's logging step closed, if ``log_metrics`` did not write it."""
        if self._due is None or not self.run.is_open:
            return
        self._sync_counters(None)
        self.run.state.step = self._due
        self._log_train({}, self._trainer.current_epoch if self._trainer is not None else None)

    def _sync_counters(self, step: int | None) -> None:
        trainer = self._trainer
        self.run.state.step = trainer.global_step if trainer is not None else (step or self.run.state.step)
        self.run.state.tokens_seen = self.tokens_seen

    def _lr(self) -> float | None:
        trainer = self._trainer
        if trainer is None or not trainer.optimizers:
            return None
        return float(trainer.optimizers[0].param_groups[0]["lr"])

    def _log_train(self, logged: dict[str, Any], epoch: Any) -> None:
        values: dict[str, Any]
        self._due = None
        if self._steps:
            steps, self._steps = self._steps, []
            folded = _fold([s for s, _ in steps] + [t for _, t in steps])
            sums, counts = folded[: len(steps)], folded[len(steps) :]
            self.window.reset()
            for loss_sum, count in zip(sums, counts, strict=True):
                self.window.add(loss_sum / count if count else 0.0, int(count))
            try:
                values = self.window.summary(self._lr())  # a non-finite loss: train_loss None, nonfinite_loss True
            finally:
                self.window.reset()
            values["loss_weighting"] = "tokens"
            self.tokens_seen += int(sum(counts))
            self.run.state.tokens_seen = self.tokens_seen
            values |= {(f"logged_{k}" if k in values else k): v for k, v in scalars(logged).items()}
        else:
            values = scalars(logged)
            if "train_loss" not in values:
                for key in ("loss", "train_loss_step"):
                    if key in values:
                        values["train_loss"] = values.pop(key)
                        break
            values.setdefault("lr", self._lr())
            values["loss_weighting"] = "logged"
        self.run.write("train", **values, **scalars({"epoch": epoch}))

    def _log_validation(self, logged: dict[str, Any], epoch: Any) -> None:
        values = scalars(logged)
        if self._val:
            batches, self._val = self._val, []
            folded = _fold([s for s, _ in batches] + [t for _, t in batches])
            loss_sum, tokens = sum(folded[: len(batches)]), sum(folded[len(batches) :])
            if "val_loss" in values:
                values["logged_val_loss"] = values.pop("val_loss")
            values |= {"val_loss": loss_sum / tokens if tokens else None, "val_tokens": int(tokens)}
        self.run.write("validation", **values, **scalars({"epoch": epoch}))


def _logs_this_step(trainer: Trainer) -> bool:
    """Whether Lightning logs at the optimizer step that just completed: its ``should_update_logs``
    rule, on ``global_step`` (the step it counts is the same with one optimizer)."""
    every = trainer.log_every_n_steps
    return bool(trainer.fast_dev_run) or (every > 0 and (trainer.global_step % every == 0 or trainer.should_stop))


def _fold(values: list[Number]) -> list[float]:
    """Numbers and tensors to floats with a single device→host transfer for all the tensors."""
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    read = iter(torch.stack([t.detach().reshape(()).double() for t in tensors]).tolist() if tensors else [])
    return [next(read) if isinstance(v, torch.Tensor) else float(v) for v in values]


__all__ = ["MetricsLogger"]
