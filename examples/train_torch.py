"""A real (tiny) PyTorch training loop wired to metrics_core: kill it at any moment, rerun it.

    python examples/train_torch.py runs/char-mlp            # trains; rerun after a kill to resume

A character-level MLP learns text generated from a small grammar (no download).  What it shows:

* ``TrainingWindow`` fed 0-d tensors — loss, the pre-clip gradient norm from ``clip_grad_norm_``,
  and an overflow flag — so the loop never waits for the device to log (one transfer per window);
* ``training_session``: ``session_start`` with the torn bytes a crash left and the checkpoint step
  it resumed from, ``session_end`` however the loop ends (Ctrl-C and SIGTERM included);
* a checkpoint every ``--checkpoint-every`` steps, written atomically (temp file + rename), with
  the counters and the data position, so a rerun resumes as a new session, redoes the steps since
  that checkpoint, and sees the same batches again.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from metrics_core import TrainingState
from metrics_core.session import training_session

CONTEXT = 16
MAX_GRAD_NORM = 1.0
SUBJECTS = ["the model", "a run", "the loss", "my job", "the scheduler", "every session", "the node"]
VERBS = ["resumes", "crashes", "converges", "logs", "stalls", "restarts", "improves"]
OBJECTS = ["from a checkpoint", "after a preemption", "without losing a record", "at step one hundred", "overnight"]


def corpus(seed: int = 0, sentences: int = 4000) -> str:
    rng = random.Random(seed)
    return " ".join(f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}." for _ in range(sentences))


class CharMLP(nn.Module):
    def __init__(self, vocab: int, width: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 24)
        self.hidden = nn.Linear(CONTEXT * 24, width)
        self.out = nn.Linear(width, vocab)

    def forward(self, context: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(self.embed(context).flatten(1))))


def batch(data: torch.Tensor, attempt: int, seed: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of attempt ``attempt``: a function of the position, so a resume sees the same data."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + attempt)
    starts = torch.randint(0, len(data) - CONTEXT - 1, (size,), generator=generator)
    windows = torch.stack([data[s : s + CONTEXT + 1] for s in starts.tolist()])
    return windows[:, :-1], windows[:, -1]


def save_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: TrainingState) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": state.step,
                "tokens_seen": state.tokens_seen, "skipped_updates": state.skipped_updates}, tmp)  # fmt: skip
    os.replace(tmp, path)  # atomic: a kill leaves the old checkpoint or the new one, never half


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--window", type=int, default=10, help="attempts per train record")
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per step (to watch it live)")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    text = corpus(args.seed)
    vocab = sorted(set(text))
    data = torch.tensor([vocab.index(c) for c in text])
    validation = batch(data, -1, args.seed, 512)
    model = CharMLP(len(vocab))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    state, resumed_from = TrainingState(), None
    checkpoint = args.run_dir / "checkpoint.pt"
    if checkpoint.exists():
        saved = torch.load(checkpoint, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state = TrainingState(saved["step"], saved["tokens_seen"], saved["skipped_updates"])
        resumed_from = state.step

    with training_session(
        args.run_dir, run_id=args.run_dir.name, state=state, resumed_from_step=resumed_from
    ) as session:
        while session.state.step < args.steps:
            attempt = session.state.step + session.state.skipped_updates + session.window.attempts
            inputs, targets = batch(data, attempt, args.seed, args.batch)
            loss = F.cross_entropy(model(inputs), targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)  # a tensor: no sync
            skipped = ~torch.isfinite(grad_norm)  # fp32 here; under fp16, GradScaler's overflow flag
            optimizer.step()
            session.window.add(loss.detach(), len(targets), grad_norm, skipped, MAX_GRAD_NORM)
            if session.window.attempts < args.window:
                time.sleep(args.sleep)
                continue
            lr = optimizer.param_groups[0]["lr"]
            session.log_window(lr)  # the one host transfer of the window; advances session.state
            if session.state.step % args.checkpoint_every == 0:
                save_checkpoint(checkpoint, model, optimizer, session.state)
                session.log_checkpoint(checkpoint.name)
            if session.state.step % 100 == 0:
                with torch.no_grad():
                    val_loss = F.cross_entropy(model(validation[0]), validation[1]).item()
                session.log_validation(val_loss, len(validation[1]))
            time.sleep(args.sleep)


if __name__ == "__main__":
    main()
