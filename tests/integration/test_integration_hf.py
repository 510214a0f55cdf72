"""metrics_core.integrations.hf on a real transformers.Trainer: a tiny GPT-2 built from a config on CPU.

No download anywhere: the model is randomly initialised from ``GPT2Config`` and the token ids are
made with torch.  The crash test runs Trainer in a child process, SIGKILLs it after a checkpoint,
resumes it with ``resume_from_checkpoint`` and reads the run back through ``RunReader``.
"""

from __future__ import annotations

import math
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from metrics_core.analysis.diagnostics import diagnose_reader
from tests.support import REPO, read_records, read_run, readme_python

torch = pytest.importorskip(
    "torch", reason="the PyTorch CPU build is not installed (.ci/run: pip install torch==2.13.0)"
)
pytest.importorskip("transformers", reason="transformers is not installed (test-only; .ci/run installs it)")
F = torch.nn.functional

# The child: trains a 2-layer GPT-2 for 40 optimizer steps (batch 4, 2 accumulation steps), logs
# every 5, saves every 10, evaluates every 20.  --hang-at N stops it dead after step N (to be
# killed); --fail-at N raises there.  Labels are -100 on a random tail of each row, so rows carry
# different token counts and a mean of means differs from the token-weighted loss.
CHILD = r"""
import sys, time
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from metrics_core.integrations.hf import MetricsCallback, TokenWeightedLoss, guard

run_dir, out_dir, mode, at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

class Rows(torch.utils.data.Dataset):
    def __init__(self, count, seed):
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, 64, (count, 1), generator=g)
        self.ids = (start + torch.arange(16)) % 64  # learnable: each token is the previous one plus 1
        self.keep = torch.randint(4, 17, (count,), generator=g)
    def __len__(self):
        return len(self.ids)
    def __getitem__(self, i):
        labels = self.ids[i].clone()
        labels[self.keep[i]:] = -100
        return {"input_ids": self.ids[i], "labels": labels}

class Stop(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if mode == "hang" and state.global_step == at:
            print("HANGING", flush=True)
            time.sleep(600)
        if mode == "fail" and state.global_step == at:
            raise RuntimeError(f"boom at {at}")

class MyTrainer(TokenWeightedLoss, Trainer):
    pass

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=16, vocab_size=64,
                                   bos_token_id=0, eos_token_id=0))
args = TrainingArguments(
    output_dir=out_dir, max_steps=40, per_device_train_batch_size=4, gradient_accumulation_steps=2,
    learning_rate=3e-3, logging_steps=5, save_steps=10, eval_strategy="steps", eval_steps=20,
    per_device_eval_batch_size=8, report_to="none", use_cpu=True, disable_tqdm=True, seed=0,
    dataloader_num_workers=0, max_grad_norm=1.0,
)
trainer = MyTrainer(model=model, args=args, train_dataset=Rows(400, 1), eval_dataset=Rows(16, 2),
                    callbacks=[MetricsCallback(run_dir), Stop()])
with guard(trainer):
    trainer.train(resume_from_checkpoint=(mode == "resume") or None)
"""


def child(tmp_path: Path, mode: str, at: int = 0, **popen: object) -> subprocess.Popen:
    script = tmp_path / "train_hf.py"
    script.write_text(CHILD)
    run, out = tmp_path / "runs" / "gpt2", tmp_path / "out"
    return subprocess.Popen([sys.executable, "-u", str(script), str(run), str(out), mode, str(at)], cwd=REPO, **popen)


def wait_hanging(process: subprocess.Popen) -> None:
    """Block until the child says it stopped at its step (Trainer prints its logs before that)."""
    assert process.stdout is not None
    for line in process.stdout:
        if line.strip() == "HANGING":
            return
    raise AssertionError(f"the child exited with {process.wait()} before reaching its step")


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen]]:
    """Child processes to SIGKILL if a test fails before ending them (a hung child would linger)."""
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_killed_after_checkpoint_then_resumed_reads_as_two_sessions_with_a_replay(
    tmp_path: Path, children: list[subprocess.Popen]
) -> None:
    """SIGKILL at step 17 (checkpoint 10 saved), resume_from_checkpoint: steps 11-17 read as replayed."""
    run = tmp_path / "runs" / "gpt2"
    first = child(tmp_path, "hang", 17, stdout=subprocess.PIPE, text=True)
    children.append(first)
    wait_hanging(first)
    first.send_signal(signal.SIGKILL)
    assert first.wait(timeout=30) == -signal.SIGKILL
    torn = b'{"schema_version":1,"event":"tra'  # as if the kill had landed mid-write
    with open(run / "metrics.jsonl", "ab") as out:
        out.write(torn)
    second = child(tmp_path, "resume", stdout=subprocess.DEVNULL)
    children.append(second)
    assert second.wait(timeout=240) == 0

    reader = read_run(run)
    s1, s2 = reader.sessions
    assert s1.end_status is None and s2.end_status == "finished"
    assert s1.resumed_from_step is None and s1.last_step == 15
    assert s2.resumed_from_step == s2.first_step == 10 and s2.discarded_bytes == len(torn)
    assert s2.steps_replayed == 5 and s2.records_superseded >= 1
    checkpoints = reader.frame("checkpoint")
    assert checkpoints["step"].tolist() == [10, 20, 30, 40]
    assert checkpoints["path"].tolist()[0].endswith("checkpoint-10")

    train = reader.effective("train")
    assert train["step"].tolist() == list(range(5, 41, 5))
    assert set(train["loss_weighting"]) == {"tokens"}
    assert (train["updates"] == 5).all() and (train["attempted_updates"] == 5).all()
    assert (train["tokens"] > 0).all() and train["lr"].notna().all() and train["grad_norm_max"].notna().all()
    # tokens_seen continued from the checkpoint's counter: every window adds up across the resume.
    assert train["tokens_seen"].tolist() == train["tokens"].cumsum().tolist()
    assert train["train_loss"].iloc[-1] < train["train_loss"].iloc[0]
    validation = reader.effective("validation")
    assert validation["step"].tolist() == [20, 40] and (validation["val_tokens"] > 0).all()
    assert validation["trainer_val_loss"].notna().all()
    assert not [f for f in diagnose_reader(reader) if f.severity == "error"]

    configs = [r for r in read_records(run / "metrics.jsonl") if r["event"] == "config"]
    assert [c["step"] for c in configs] == [0, 10]
    assert configs[0]["config"]["model_config"]["n_layer"] == 2
    assert configs[0]["config"]["training_arguments"]["logging_steps"] == 5


def test_exception_and_sigterm_end_the_session_as_failed_and_interrupted(
    tmp_path: Path, children: list[subprocess.Popen]
) -> None:
    """guard(): an exception in train() writes failed with the error; SIGTERM writes interrupted, exit 143."""
    failing = child(tmp_path, "fail", 3, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    children.append(failing)
    _, stderr = failing.communicate(timeout=240)
    assert failing.returncode == 1 and "boom at 3" in stderr
    (session,) = read_run(tmp_path / "runs" / "gpt2").sessions
    assert session.end_status == "failed"
    end = [r for r in read_records(tmp_path / "runs" / "gpt2" / "metrics.jsonl") if r["event"] == "session_end"]
    assert end[0]["error"] == "RuntimeError: boom at 3"

    hanging = child(tmp_path, "hang", 12, stdout=subprocess.PIPE, text=True)
    children.append(hanging)
    wait_hanging(hanging)
    hanging.send_signal(signal.SIGTERM)
    assert hanging.wait(timeout=30) == 143
    sessions = read_run(tmp_path / "runs" / "gpt2").sessions
    assert [s.end_status for s in sessions] == ["failed", "interrupted"]
    end = [r for r in read_records(tmp_path / "runs" / "gpt2" / "metrics.jsonl") if r["event"] == "session_end"]
    assert end[-1]["error"] == "SIGTERM" and end[-1]["step"] == 12


@pytest.mark.parametrize("token_weighted", [True, False])
def test_train_and_val_loss_are_token_weighted_where_trainer_averages_means(
    tmp_path: Path, token_weighted: bool
) -> None:
    """With lr=0, one window over the whole data: TokenWeightedLoss equals sum(token CE)/tokens exactly."""
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from metrics_core.integrations.hf import MetricsCallback, TokenWeightedLoss

    torch.manual_seed(0)
    tiny = GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=32,
        n_positions=12,
        vocab_size=64,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )  # no dropout: train and eval compute the same
    ids = torch.randint(0, 64, (16, 12))
    labels = ids.clone()
    for row, keep in enumerate([2, 12, 3, 12, 5, 12, 2, 9, 12, 4, 12, 2, 7, 12, 3, 12]):
        labels[row, keep:] = -100
    rows = [{"input_ids": i, "labels": lab} for i, lab in zip(ids, labels, strict=True)]
    model = GPT2LMHeadModel(tiny)
    with torch.no_grad():  # the exact figure, computed directly
        logits = model(input_ids=ids).logits[:, :-1]
        target = labels[:, 1:]
        expected = F.cross_entropy(logits.reshape(-1, 64), target.reshape(-1), ignore_index=-100, reduction="sum")
        tokens = int((target != -100).sum())
        expected = expected.item() / tokens
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=2, gradient_accumulation_steps=2,
        learning_rate=0.0, weight_decay=0.0, logging_steps=4, save_strategy="no", eval_strategy="steps",
        eval_steps=4, per_device_eval_batch_size=4, report_to="none", use_cpu=True, disable_tqdm=True,
        include_num_input_tokens_seen="no" if token_weighted else "all",
    )  # fmt: skip
    trainer_class = type("T", (TokenWeightedLoss, Trainer), {}) if token_weighted else Trainer
    run = tmp_path / "runs" / "exact"
    trainer = trainer_class(
        model=model, args=args, train_dataset=rows, eval_dataset=rows, callbacks=[MetricsCallback(run)]
    )
    trainer.train()

    reader = read_run(run)
    (train,) = reader.frame("train").to_dict("records")
    (validation,) = reader.frame("validation").to_dict("records")
    assert reader.sessions[0].end_status == "finished"
    assert train["step"] == 4 and train["updates"] == 4
    if token_weighted:
        assert train["loss_weighting"] == "tokens" and train["tokens"] == tokens
        assert math.isclose(train["train_loss"], expected, rel_tol=1e-5)
        assert math.isclose(validation["val_loss"], expected, rel_tol=1e-5) and validation["val_tokens"] == tokens
        # Trainer's own figures are means of means: on rows this uneven they are off.
        assert abs(train["trainer_loss"] - expected) > 1e-3
        assert abs(validation["trainer_val_loss"] - expected) > 1e-3
        assert train["tokens_seen"] == tokens
    else:
        assert train["loss_weighting"] == "trainer_mean_of_step_means"
        assert train["tokens"] == train["tokens_seen"] == 16 * 12  # Trainer's input-token count
        assert abs(train["train_loss"] - expected) > 1e-3


class SameRow(torch.utils.data.Dataset):
    """``count`` copies of one row (8 label tokens after the shift); raises at fetch ``fail_at``, if given."""

    def __init__(self, row: dict[str, torch.Tensor], count: int, fail_at: int | None = None) -> None:
        self.row, self.count, self.fail_at, self.fetched = row, count, fail_at, 0

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        self.fetched += 1
        if self.fetched == self.fail_at:
            raise RuntimeError("data source lost")
        return self.row


def test_readme_snippet_starts_on_a_fresh_directory_and_resumes_from_the_last_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README's Hugging Face code as written: a fresh output_dir trains until its data fails in step 13 or 14, a rerun
    resumes from checkpoint-12 to 20; losses equal the model's own and Trainer's, tokens and tokens_seen are exact."""
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    monkeypatch.chdir(tmp_path)  # the snippet's relative runs/ directory
    snippet = readme_python("metrics_core.integrations.hf import")
    torch.manual_seed(0)
    tiny = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=12, vocab_size=64, bos_token_id=0, eos_token_id=0,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    model = GPT2LMHeadModel(tiny)
    ids = torch.randint(0, 64, (12,))
    row = {"input_ids": ids, "labels": torch.where(torch.arange(12) < 9, ids, -100)}
    with torch.no_grad():  # lr=0 keeps the weights: every micro-batch's loss is the model's own on this row
        own_loss = model(input_ids=ids[None], labels=row["labels"][None]).loss.item()
    args = TrainingArguments(
        output_dir="out", max_steps=20, per_device_train_batch_size=2, gradient_accumulation_steps=2,
        learning_rate=0.0, weight_decay=0.0, logging_steps=5, save_steps=4, report_to="none", use_cpu=True,
        disable_tqdm=True, seed=0,
    )  # fmt: skip
    tokens_per_step = 2 * 2 * 8
    with pytest.raises(RuntimeError, match="data source lost"):
        exec(snippet, {"model": model, "args": args, "ds": SameRow(row, 400, fail_at=4 * 13 + 1)})
    resumed: dict[str, object] = {"model": GPT2LMHeadModel(tiny), "args": args, "ds": SameRow(row, 400)}
    exec(snippet, resumed)

    reader = read_run(tmp_path / "runs" / "gpt2")
    s1, s2 = reader.sessions
    assert (s1.end_status, s1.resumed_from_step) == ("failed", None)
    assert (s2.end_status, s2.resumed_from_step) == ("finished", 12)
    trainer_loss = {entry["step"]: entry["loss"] for entry in resumed["trainer"].state.log_history if "loss" in entry}
    train = reader.effective("train")
    assert train["step"].tolist() == [5, 10, 15, 20] and set(train["loss_weighting"]) == {"tokens"}
    # the first window after the resume counts steps 13-15: those of 11-12 died with the first process
    assert train["updates"].tolist() == [5, 5, 3, 5]
    assert train["tokens"].tolist() == [updates * tokens_per_step for updates in train["updates"]]
    assert train["tokens_seen"].tolist() == [step * tokens_per_step for step in train["step"]]
    for record in train.to_dict("records"):
        assert math.isclose(record["train_loss"], own_loss, rel_tol=1e-5)
        assert math.isclose(record["trainer_loss"], trainer_loss[record["step"]], rel_tol=1e-6)
    checkpoints = reader.frame("checkpoint")
    assert checkpoints["step"].tolist() == [4, 8, 12, 16, 20]
    # saved between logging steps: the tokens trained up to the checkpoint, as its trainer_state.json holds
    assert checkpoints["tokens_seen"].tolist() == [step * tokens_per_step for step in checkpoints["step"]]
    assert not [f for f in diagnose_reader(reader) if f.severity == "error"]


def test_importing_metrics_core_loads_no_framework() -> None:
    """transformers and lightning stay test-only: the package and its integrations package import neither."""
    code = (
        "import sys, metrics_core, metrics_core.integrations\n"
        "print(sorted(m for m in ('transformers', 'lightning', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
