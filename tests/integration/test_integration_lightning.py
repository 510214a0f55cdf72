"""metrics_core.integrations.lightning on a real lightning.pytorch.Trainer with a tiny module on CPU."""

from __future__ import annotations

import math
import os
import signal
import warnings
from pathlib import Path

import pytest

from metrics_core.analysis.diagnostics import diagnose_reader
from tests.support import read_records, read_run, readme_python

torch = pytest.importorskip(
    "torch", reason="the PyTorch CPU build is not installed (.ci/run: pip install torch==2.13.0)"
)
pl = pytest.importorskip("lightning.pytorch", reason="lightning is not installed (test-only; .ci/run installs it)")
F, nn = torch.nn.functional, torch.nn
DataLoader, TensorDataset = torch.utils.data.DataLoader, torch.utils.data.TensorDataset
LightningModule, Trainer, ModelCheckpoint = pl.LightningModule, pl.Trainer, pl.callbacks.ModelCheckpoint

from metrics_core.integrations.lightning import MetricsLogger  # noqa: E402 (imports torch and lightning: checked above)

VOCAB = 32


def rows(count: int, seed: int) -> TensorDataset:
    """Token rows where each token is the previous plus one, with a -100 tail of random length."""
    generator = torch.Generator().manual_seed(seed)
    ids = (torch.randint(0, VOCAB, (count, 1), generator=generator) + torch.arange(12)) % VOCAB
    labels = ids.clone()
    for row, keep in enumerate(torch.randint(2, 13, (count,), generator=generator).tolist()):
        labels[row, keep:] = -100
    return TensorDataset(ids, labels)


class TinyLM(LightningModule):
    """A bigram model; returns {"loss", "tokens"} and records what it returned, as the test's oracle."""

    logs_loss = True  # also self.log("train_loss") in training_step

    def __init__(self, lr: float = 0.05, width: int = 16, fail_at: int | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(VOCAB, width)
        self.out = nn.Linear(width, VOCAB)
        self.returned: list[tuple[int, float, int]] = []  # (global_step before the update, loss, tokens)
        self.val_returned: list[tuple[float, int]] = []

    def _loss(self, batch: list[torch.Tensor]) -> tuple[torch.Tensor, int]:
        ids, labels = batch
        logits = self.out(self.embed(ids[:, :-1]))
        target = labels[:, 1:]
        tokens = int((target != -100).sum())
        return F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1), ignore_index=-100), tokens

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> dict[str, object]:
        if self.hparams.fail_at is not None and self.global_step == self.hparams.fail_at:
            raise RuntimeError(f"boom at {self.global_step}")
        loss, tokens = self._loss(batch)
        self.returned.append((self.global_step, loss.item(), tokens))
        if self.logs_loss:
            self.log("train_loss", loss)
        return {"loss": loss, "tokens": tokens}

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> dict[str, object]:
        loss, tokens = self._loss(batch)
        if not self.trainer.sanity_checking:
            self.val_returned.append((loss.item(), tokens))
        self.log("val_loss", loss)
        return {"loss": loss, "tokens": tokens}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class ReadmeLM(TinyLM):
    """The module the README describes: training_step returns {"loss", "tokens"} and never calls self.log."""

    logs_loss = False

    def train_dataloader(self) -> DataLoader:
        return DataLoader(rows(400, 1), batch_size=4, shuffle=True)


def fit(run: Path, root: Path, module: TinyLM, max_steps: int, ckpt_path: Path | None = None) -> MetricsLogger:
    logger = MetricsLogger(run)
    checkpoints = ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=10, save_top_k=-1, filename="{step}")
    trainer = Trainer(
        accelerator="cpu", max_steps=max_steps, enable_progress_bar=False, enable_model_summary=False,
        logger=logger, callbacks=[logger, checkpoints], log_every_n_steps=5, val_check_interval=10,
        check_val_every_n_epoch=None, default_root_dir=root,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on num_workers and the like
        trainer.fit(
            module,
            DataLoader(rows(400, 1), batch_size=4, shuffle=True),
            DataLoader(rows(24, 2), batch_size=8),
            ckpt_path=ckpt_path,
        )
    return logger


def test_fit_writes_token_weighted_windows_validation_config_and_checkpoints(tmp_path: Path) -> None:
    """One fit: session markers, hparams as config, train windows equal sum(loss*tokens)/tokens of the steps,
    checkpoint records count the tokens up to their step."""
    run = tmp_path / "runs" / "tiny"
    module = TinyLM()
    fit(run, tmp_path, module, max_steps=20)

    reader = read_run(run)
    (session,) = reader.sessions
    assert session.end_status == "finished" and session.resumed_from_step is None
    train = reader.frame("train")
    assert train["step"].tolist() == [5, 10, 15, 20]
    assert set(train["loss_weighting"]) == {"tokens"} and (train["updates"] == 5).all()
    for record in train.to_dict("records"):
        window = [
            (loss, tokens) for step, loss, tokens in module.returned if record["step"] - 5 <= step < record["step"]
        ]
        tokens = sum(t for _, t in window)
        assert record["tokens"] == tokens
        assert math.isclose(record["train_loss"], sum(loss * t for loss, t in window) / tokens, rel_tol=1e-6)
        assert record["lr"] == 0.05 and "logged_train_loss" in record
    assert train["tokens_seen"].tolist() == train["tokens"].cumsum().tolist()
    validation = reader.frame("validation")
    assert validation["step"].tolist() == [10, 20]
    val_tokens = sum(t for _, t in module.val_returned[:3])
    assert validation["val_tokens"].tolist() == [val_tokens, val_tokens]
    first_val = sum(loss * t for loss, t in module.val_returned[:3]) / val_tokens
    assert math.isclose(validation["val_loss"].iloc[0], first_val, rel_tol=1e-6)
    checkpoints = reader.frame("checkpoint")
    assert checkpoints["step"].tolist() == [10, 20] and checkpoints["path"].iloc[0].endswith("step=10.ckpt")
    # saved before Lightning logs the step, yet counting its tokens: the train record of that step agrees
    assert checkpoints["tokens_seen"].tolist() == train.set_index("step")["tokens_seen"][[10, 20]].tolist()
    (config,) = [r for r in read_records(run / "metrics.jsonl") if r["event"] == "config"]
    assert config["config"] == {"lr": 0.05, "width": 16, "fail_at": None}
    assert not [f for f in diagnose_reader(reader) if f.severity == "error"]


def test_fit_resumed_from_a_checkpoint_reads_as_a_second_session_with_a_replay(tmp_path: Path) -> None:
    """fit(ckpt_path=step 10) after a run that got to 20: session 2 starts at 10, steps 11-20 are replayed."""
    run = tmp_path / "runs" / "tiny"
    fit(run, tmp_path, TinyLM(), max_steps=20)
    fit(run, tmp_path, TinyLM(), max_steps=30, ckpt_path=tmp_path / "ckpt" / "step=10.ckpt")

    reader = read_run(run)
    s1, s2 = reader.sessions
    assert s1.end_status == s2.end_status == "finished"
    assert s2.resumed_from_step == s2.first_step == 10 and s2.steps_replayed == 10
    train = reader.effective("train")
    assert train["step"].tolist() == [5, 10, 15, 20, 25, 30]
    # tokens_seen came back from the checkpoint: the effective history adds up across the resume.
    assert train["tokens_seen"].tolist() == train["tokens"].cumsum().tolist()
    assert not [f for f in diagnose_reader(reader) if f.severity == "error"]


def test_an_exception_in_training_ends_the_session_failed_with_the_error(tmp_path: Path) -> None:
    """finalize("failed") inside Lightning's except block: session_end failed, with the exception's text."""
    run = tmp_path / "runs" / "tiny"
    with pytest.raises(RuntimeError, match="boom at 7"):
        fit(run, tmp_path, TinyLM(fail_at=7), max_steps=20)
    (session,) = read_run(run).sessions
    assert session.end_status == "failed"
    (end,) = [r for r in read_records(run / "metrics.jsonl") if r["event"] == "session_end"]
    assert end["error"] == "RuntimeError: boom at 7" and end["step"] == 7


def test_sigterm_during_fit_ends_the_session_interrupted(tmp_path: Path) -> None:
    """A scheduler's SIGTERM mid-fit: Lightning exits through SIGTERMException; session_end says interrupted."""
    run = tmp_path / "runs" / "tiny"
    module = TinyLM()
    module.on_train_batch_start = lambda batch, batch_idx: (  # type: ignore[method-assign]
        os.kill(os.getpid(), signal.SIGTERM) if module.global_step == 6 else None
    )
    with pytest.raises(SystemExit):
        fit(run, tmp_path, module, max_steps=20)
    (session,) = read_run(run).sessions
    assert session.end_status == "interrupted"
    (end,) = [r for r in read_records(run / "metrics.jsonl") if r["event"] == "session_end"]
    assert end["error"] == "SIGTERM" and end["step"] in (6, 7)


def test_readme_snippet_records_what_training_step_returned_fresh_and_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README's Lightning code as written, module without self.log: fails at 25, reruns from last.ckpt (20) to 40;
    every window, tokens_seen and checkpoint record equals what training_step returned."""
    monkeypatch.chdir(tmp_path)  # the snippet's relative runs/ and checkpoints/
    snippet = readme_python("metrics_core.integrations.lightning import")
    first, second = ReadmeLM(fail_at=25), ReadmeLM()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on num_workers, no last checkpoint yet, and the like
        with pytest.raises(RuntimeError, match="boom at 25"):
            exec(snippet, {"model": first})
        exec(snippet, {"model": second})

    reader = read_run(tmp_path / "runs" / "my-run")
    s1, s2 = reader.sessions
    assert (s1.end_status, s1.resumed_from_step) == ("failed", None)
    assert (s2.end_status, s2.resumed_from_step) == ("finished", 20)
    # optimizer step k trained on what training_step returned at global_step k - 1
    trained = {step + 1: (loss, tokens) for step, loss, tokens in first.returned if step < 20}
    trained |= {step + 1: (loss, tokens) for step, loss, tokens in second.returned}
    assert sorted(trained) == list(range(1, 41))
    tokens_through = {step: sum(trained[k][1] for k in range(1, step + 1)) for step in trained}

    train = reader.effective("train")
    assert train["step"].tolist() == list(range(5, 41, 5)) and set(train["loss_weighting"]) == {"tokens"}
    for record in train.to_dict("records"):
        window = [trained[k] for k in range(record["step"] - 4, record["step"] + 1)]
        assert record["updates"] == 5 and record["tokens"] == sum(t for _, t in window)
        assert math.isclose(record["train_loss"], sum(loss * t for loss, t in window) / record["tokens"], rel_tol=1e-6)
        assert record["tokens_seen"] == tokens_through[record["step"]]
    checkpoints = reader.frame("checkpoint")
    assert set(checkpoints["step"]) == {10, 20, 30, 40} and checkpoints["path"].str.endswith("last.ckpt").any()
    for record in checkpoints.to_dict("records"):
        assert record["tokens_seen"] == tokens_through[record["step"]], record
    assert not [f for f in diagnose_reader(reader) if f.severity == "error"]
