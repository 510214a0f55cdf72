"""Hugging Face ``transformers.Trainer`` → ``metrics.jsonl``, without touching the training loop.

    from metrics_core.integrations.hf import MetricsCallback, TokenWeightedLoss, guard, last_checkpoint

    class MyTrainer(TokenWeightedLoss, Trainer):   # optional: exact token-weighted train/val loss
        pass

    trainer = MyTrainer(model=model, args=args, train_dataset=..., callbacks=[MetricsCallback("runs/gpt2")])
    with guard(trainer):                           # optional: session_end also on failure / SIGTERM
        trainer.train(resume_from_checkpoint=last_checkpoint(args.output_dir))

``last_checkpoint`` is the newest ``checkpoint-N`` in the output directory, or None when there is
none yet: ``resume_from_checkpoint=True`` raises on a fresh directory, so one script could not
both start a run and resume it.

Records
-------
* ``session_start`` in ``on_train_begin``, after Trainer restored its checkpoint: the step it
  resumed from (``resumed_from_step``, None on a fresh start) and the torn bytes a SIGKILL left
  (``discarded_bytes``); then one ``config`` record: ``TrainingArguments`` and the model's config.
* ``train`` at each of Trainer's logging steps, with the fields of docs/FORMAT.md (``train_loss``,
  ``lr``, ``tokens``, ``attempted_updates``, ``updates``, ``skipped_updates_in_window``,
  ``grad_norm_avg`` / ``grad_norm_max``, ``clipped_fraction``) plus ``grad_norm_last`` (Trainer's own
  ``grad_norm``: the last step's pre-clip norm), ``epoch`` and ``loss_weighting`` (below).
* ``validation`` after each evaluation: ``eval_loss`` → ``val_loss``, every other ``eval_X`` → ``val_X``.
* ``checkpoint`` after each save, with the checkpoint directory as ``path``.
* ``trainer_summary`` with Trainer's end-of-training figures (its run-average loss is renamed
  ``mean_logged_loss``: it is not a window's ``train_loss``).
* ``session_end``: ``finished`` in ``on_train_end``.  Trainer tells callbacks nothing about an
  exception, so ``failed`` (with the exception) and ``interrupted`` (Ctrl-C, or SIGTERM, which
  ``guard`` turns into an exception and then exit status 143) are written by ``guard``; without
  it a crashed ``train()`` leaves a session with no end, which the reader reports as crashed.

Counters: ``step`` is Trainer's ``global_step`` less the FP16-overflow steps it skipped (Trainer
counts those as steps; the format does not).  ``tokens_seen`` is Trainer's
``num_input_tokens_seen`` when ``include_num_input_tokens_seen`` is on, else the loss tokens that
``TokenWeightedLoss`` counted, else 0.  The callback's own counters are saved in every
checkpoint's ``trainer_state.json`` (``stateful_callbacks``) and restored from it on
``resume_from_checkpoint``, so a resumed session continues the counters of the checkpoint, and
the steps the previous session logged after that checkpoint read as replayed.  Only the
world-rank-0 process writes.

Trainer's logged loss is not token-weighted
-------------------------------------------
Trainer's ``loss`` is ``sum(per-step loss) / steps`` over the ``logging_steps`` window: a mean of
per-step means, each step weighted 1 whatever its token count.  Within a step, a model that
ignores ``num_items_in_batch`` gives per-micro-batch means divided by the accumulation count
(again a mean of means); padding and ``-100`` labels change a micro-batch's token count, not its
weight.  ``eval_loss`` is the mean of per-batch losses (weighted by examples, not tokens).  And
the denominator itself can be off: Trainer counts ``labels[..., 1:]`` only for models whose
``loss_type`` it maps to the causal-LM loss; for one it does not (``GPT2LMHeadModel`` in
transformers 5.24: ``loss_type`` None) it counts every row's position 0 too, which is never
predicted, and reports (and back-propagates) the loss scaled by predicted/counted tokens — 0.87
on the test's uneven rows.  Without ``TokenWeightedLoss`` the callback writes Trainer's value as
``train_loss`` with ``loss_weighting: "trainer_mean_of_step_means"``.

``TokenWeightedLoss`` (a ``Trainer`` mixin) is the exact one: its ``compute_loss`` takes the
model's logits and labels and adds, under ``no_grad``, the summed cross-entropy and the number of
label tokens of every micro-batch (shifted by one for causal LMs: ``shift_labels``), kept as
tensors; the callback folds them into a ``TrainingWindow`` per optimizer step, with the step's
pre-clip gradient norm and skip flag, and writes its summary: ``train_loss`` is then
``sum of token losses / tokens`` over the window (``loss_weighting: "tokens"``), ``tokens`` are
label tokens, and ``trainer_loss`` keeps Trainer's figure beside it for comparison.  Evaluation
gets the same: ``val_loss`` / ``val_tokens`` token-weighted, ``trainer_val_loss`` beside them.
Cost: one cross-entropy over the logits per micro-batch (no extra backward) and one device→host
transfer per logging window.  The pre-clip norm is read through ``Trainer._get_grad_norm``, a
private method; where a version lacks it the window simply has no gradient-norm statistics.
In multi-GPU training both are rank 0's share of the batch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import get_last_checkpoint

from metrics_core.integrations._common import RunSession, scalars
from metrics_core.write.session_end import SIGTERM_EXIT, Terminated, end_status, sigterm_raises
from metrics_core.write.window import TrainingWindow

IGNORE_INDEX = -100  # transformers' label for "no loss here" (padding, prompt tokens)


class MetricsCallback(TrainerCallback, ExportableState):
    """Writes a ``Trainer`` run to ``directory/metrics.jsonl``; see the module docstring."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        run_id: str | None = None,
        fsync: bool = False,
        token_weighted: bool = False,
        tokens_seen: int = 0,
        skipped_updates: int = 0,
        system_metrics: bool = True,
    ) -> None:
        # The arguments are also what Trainer re-creates the callback from when
        # restore_callback_states_from_checkpoint is set (ExportableState.from_state).
        self.directory = os.fspath(directory)
        self.run_id = run_id
        self.fsync = fsync
        self.token_weighted = token_weighted  # set by TokenWeightedLoss: tokens are then label tokens
        self.tokens_seen = tokens_seen
        self.skipped_updates = skipped_updates
        self.system_metrics = system_metrics
        self.run = RunSession(directory, run_id=run_id, fsync=fsync, system_metrics=system_metrics)
        self.window = TrainingWindow()
        self._micro: list[tuple[torch.Tensor, torch.Tensor]] = []  # this step's (loss sum, tokens)
        self._steps: list[tuple[torch.Tensor, torch.Tensor, Any, bool]] = []  # per optimizer step
        self._eval: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._grad_norm: Any = None
        self._window_steps = 0
        self._window_skips = 0
        self._last_hf_tokens = 0

    # -- ExportableState: saved into trainer_state.json with every checkpoint ----------------------
    def state(self) -> dict[str, Any]:
        return {
            "args": {
                "directory": self.directory,
                "run_id": self.run_id,
                "fsync": self.fsync,
                "token_weighted": self.token_weighted,
                "system_metrics": self.system_metrics,
            },
            "attributes": {
                "tokens_seen": self.tokens_seen + self._pending_tokens(),
                "skipped_updates": self.skipped_updates,
            },
        }

    def _pending_tokens(self) -> int:
        """Label tokens of steps not yet logged (a checkpoint between two logs); one host transfer."""
        if not self._steps:
            return 0
        return int(torch.stack([tokens for _, tokens, _, _ in self._steps]).sum().item())

    # -- fed by TokenWeightedLoss ----------------------------------------------------------------
    def add_micro_batch(self, loss_sum: torch.Tensor, tokens: torch.Tensor, *, training: bool) -> None:
        """One micro-batch's summed token loss and label-token count, both tensors: no device sync."""
        if not self.run.is_open:  # another rank, or evaluate() outside train()
            return
        (self._micro if training else self._eval).append((loss_sum, tokens))

    def note_grad_norm(self, grad_norm: Any) -> None:
        self._grad_norm = grad_norm

    # -- TrainerCallback ----------------------------------------------------------------------------
    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if not state.is_world_process_zero:
            return
        if self.run.is_open:  # a previous train() in this process raised, outside guard(): close it
            self.run.end(RuntimeError("train() raised before on_train_end; wrap it in guard() to record why"))
        resumed = state.global_step > 0
        if resumed:  # our counters as of the checkpoint Trainer just loaded
            saved = (state.stateful_callbacks or {}).get(type(self).__name__)
            saved = saved[0] if isinstance(saved, list) and saved else saved
            attributes = saved.get("attributes", {}) if isinstance(saved, Mapping) else {}
            self.tokens_seen = int(attributes.get("tokens_seen", 0))
            self.skipped_updates = int(attributes.get("skipped_updates", 0))
        else:
            self.tokens_seen = self.skipped_updates = 0
        self._micro, self._steps, self._eval, self._grad_norm = [], [], [], None
        self._window_steps = self._window_skips = 0
        self.window.reset()
        self._last_hf_tokens = state.num_input_tokens_seen
        self._sync_counters(args, state)
        model = kwargs.get("model")
        model_config = getattr(model, "config", None)
        config: dict[str, Any] = {"training_arguments": args.to_dict(), "integration": "transformers"}
        if model_config is not None and hasattr(model_config, "to_dict"):
            config["model_config"] = model_config.to_dict()
        self.run.start(self.run.state.step if resumed else None, config)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if not self.run.is_open:
            return
        # accelerate's optimizer knows whether GradScaler skipped this step (FP16 overflow).
        skipped = bool(getattr(kwargs.get("optimizer"), "step_was_skipped", False))
        self._window_steps += 1
        self._window_skips += skipped
        self.skipped_updates += skipped
        if self._micro:
            loss_sum = torch.stack([loss for loss, _ in self._micro]).sum()
            tokens = torch.stack([count for _, count in self._micro]).sum()
            self._steps.append((loss_sum, tokens, self._grad_norm, skipped))
        self._micro, self._grad_norm = [], None
        self._sync_counters(args, state)  # so that a session_end written by guard has this step

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not self.run.is_open or not logs:
            return
        if "loss" in logs:
            self._log_train(args, state, logs)
        elif any(key.startswith("eval_") for key in logs):
            self._log_validation(args, state, logs)
        elif "train_runtime" in logs:
            self._sync_counters(args, state)
            summary = {("mean_logged_loss" if key == "train_loss" else key): value for key, value in logs.items()}
            self.run.write("trainer_summary", **scalars(summary))
        else:  # a user's own trainer.log({...})
            self._sync_counters(args, state)
            self.run.write("trainer_log", **scalars(logs))

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.run.is_open:
            self._sync_counters(args, state)
            # A save between two logging steps: the checkpoint holds the unlogged steps' tokens (state()).
            self.run.state.tokens_seen = self.tokens_seen + self._pending_tokens()
            self.run.write("checkpoint", path=os.path.join(args.output_dir, f"checkpoint-{state.global_step}"))

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._eval = []  # consumed by on_log; dropped here if the metrics were not logged

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._sync_counters(args, state)
        self.run.end(None)

    def end(self, exc: BaseException | None) -> None:
        """Write ``session_end`` for ``exc`` if the session is still open (what ``guard`` calls)."""
        if self.run.is_open:
            self.run.state.tokens_seen = self.tokens_seen + self._pending_tokens()
        self.run.end(exc)

    # -- records ------------------------------------------------------------------------------------
    def _sync_counters(self, args: TrainingArguments, state: TrainerState) -> None:
        if not self.token_weighted and args.include_num_input_tokens_seen not in ("no", False):
            self.tokens_seen = state.num_input_tokens_seen
        counters = self.run.state
        counters.step = state.global_step - self.skipped_updates
        counters.tokens_seen = self.tokens_seen
        counters.skipped_updates = self.skipped_updates

    def _log_train(self, args: TrainingArguments, state: TrainerState, logs: dict[str, Any]) -> None:
        lr = logs.get("learning_rate")
        grad_norm = logs.get("grad_norm")
        max_norm = args.max_grad_norm
        extra: dict[str, Any] = {"grad_norm_last": grad_norm, "epoch": logs.get("epoch")}
        if self._steps:
            fields = self._fold_window(lr, max_norm)
            fields |= {"loss_weighting": "tokens", "trainer_loss": logs["loss"]}
            self.tokens_seen += fields["tokens"]
        else:
            steps, skips = self._window_steps, self._window_skips
            one_step = steps == 1 and isinstance(grad_norm, float)
            hf_tokens = state.num_input_tokens_seen
            fields = {
                "train_loss": logs["loss"],
                "lr": lr,
                "attempted_updates": steps,
                "updates": steps - skips,
                "skipped_updates_in_window": skips,
                "grad_norm_avg": grad_norm if one_step else None,
                "grad_norm_max": grad_norm if one_step else None,
                "clipped_fraction": float(grad_norm > max_norm) if one_step and max_norm > 0 else None,
                "loss_weighting": "trainer_mean_of_step_means",
            }
            if args.include_num_input_tokens_seen not in ("no", False):
                fields["tokens"] = hf_tokens - self._last_hf_tokens
            self._last_hf_tokens = hf_tokens
        self._window_steps = self._window_skips = 0
        self._sync_counters(args, state)
        self.run.write("train", **scalars({**fields, **extra}))

    def _fold_window(self, lr: float | None, max_norm: float) -> dict[str, Any]:
        """The window of exact per-step sums as a ``TrainingWindow`` summary: one host transfer."""
        steps, self._steps = self._steps, []
        counts = torch.stack([tokens for _, tokens, _, _ in steps]).tolist()
        self.window.reset()
        for (loss_sum, _, norm, skipped), count in zip(steps, counts, strict=True):
            mean = loss_sum / max(count, 1)  # a step with no label tokens weighs 0 whatever its loss
            self.window.add(mean, int(count), norm, skipped, max_norm)
        try:
            return self.window.summary(lr)  # a NaN/inf loss: train_loss None, nonfinite_loss True
        finally:
            self.window.reset()

    def _log_validation(self, args: TrainingArguments, state: TrainerState, logs: dict[str, Any]) -> None:
        values = {}
        for key, value in logs.items():
            if key == "epoch":
                values["epoch"] = value
            elif key.startswith("eval_"):
                values["val_" + key[len("eval_") :]] = value
        if self._eval:
            batches, self._eval = self._eval, []
            loss_sum, tokens = torch.stack([torch.stack([s.double(), t.double()]) for s, t in batches]).sum(0).tolist()
            values["trainer_val_loss"] = values.pop("val_loss", None)
            values["val_loss"] = loss_sum / tokens if tokens else None
            values["val_tokens"] = int(tokens)
        self._sync_counters(args, state)
        self.run.write("validation", **scalars(values))


def last_checkpoint(output_dir: str | os.PathLike[str]) -> str | None:
    """The newest ``checkpoint-N`` directory in ``output_dir`` (transformers' own rule,
    ``get_last_checkpoint``), or None when the directory or a checkpoint in it does not exist yet:
    what ``train(resume_from_checkpoint=...)`` takes to resume a run and to start one."""
    return get_last_checkpoint(os.fspath(output_dir)) if os.path.isdir(output_dir) else None


def _callbacks(trainer: Trainer) -> list[MetricsCallback]:
    return [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, MetricsCallback)]


class TokenWeightedLoss:
    """``Trainer`` mixin (put it before ``Trainer``) feeding exact token losses to ``MetricsCallback``.

    ``shift_labels``: the logit at position t predicts label t+1 (causal LMs, the default); set it
    to False for models whose labels are aligned with their logits (masked LM, token
    classification).  The model must return ``logits`` and the batch carry ``labels``.
    """

    shift_labels: bool = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for callback in _callbacks(self):  # type: ignore[arg-type]
            callback.token_weighted = True

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        labels = inputs.get("labels")
        loss, outputs = super().compute_loss(  # type: ignore[misc]
            model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch
        )
        logits = outputs.get("logits") if isinstance(outputs, Mapping) else None
        callbacks = _callbacks(self)  # type: ignore[arg-type]
        if labels is not None and logits is not None and callbacks:
            with torch.no_grad():
                if self.shift_labels:
                    logits, labels = logits[..., :-1, :], labels[..., 1:]
                labels = labels.to(logits.device)
                loss_sum = F.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]).float(),
                    labels.reshape(-1),
                    ignore_index=IGNORE_INDEX,
                    reduction="sum",
                )
                tokens = (labels != IGNORE_INDEX).sum()
            for callback in callbacks:
                callback.add_micro_batch(loss_sum, tokens, training=model.training)
        return (loss, outputs) if return_outputs else loss

    def _get_grad_norm(self, model: torch.nn.Module, grad_norm: Any = None) -> Any:
        norm = super()._get_grad_norm(model, grad_norm=grad_norm)  # type: ignore[misc]
        for callback in _callbacks(self):  # type: ignore[arg-type]
            callback.note_grad_norm(norm)
        return norm


@contextmanager
def guard(trainer: Trainer) -> Iterator[Trainer]:
    """Around ``trainer.train()``: ``session_end`` ``failed`` / ``interrupted`` when it raises.

    SIGTERM (a scheduler's preemption notice) raises inside ``train()`` while the block runs, so
    the session ends ``interrupted`` and the process exits with status 143 (``SystemExit``).
    """
    try:
        with sigterm_raises():
            yield trainer
    except Terminated as exc:
        for callback in _callbacks(trainer):
            callback.end(exc)
        raise SystemExit(SIGTERM_EXIT) from None
    except BaseException as exc:
        if end_status(exc)[0] != "finished":
            for callback in _callbacks(trainer):
                callback.end(exc)
        raise


__all__ = ["IGNORE_INDEX", "MetricsCallback", "TokenWeightedLoss", "guard", "last_checkpoint"]
