"""A live demo sweep: real (small) training through the real MetricsWriter + TrainingWindow path.

``python -m metrics_core.dashboard.demo ROOT`` trains a two-layer numpy MLP on a synthetic
regression task with mixed-precision-style dynamic loss scaling, as a sweep of two learning rates
and two seeds (``SWEEP``: four runs under ROOT, each with its config), so the runs page, Compare,
groups with bands, Sweep and Sessions all have something to show.  One run,
``STORY_RUN``, is the live one, killed and resumed; the other three are replayed in a few seconds
and finish.  The log shows what the dashboard is for:

* FP16-style skipped updates: the loss scale grows until the scaled gradient overflows the
  float16 range, the step is skipped and the scale halves, as ``torch.cuda.amp.GradScaler`` does;
* gradient clipping at ``max_grad_norm`` and the clipped fraction it causes;
* a crash: session 1 dies with half a record on disk (a torn last line), session 2 resumes from
  an *older* checkpoint, redoing steps, then crashes the same way; session 3 resumes and keeps
  training live, one window a second, until ``--steps``.

Sessions 1 and 2 are history replayed in a second or two, so their records carry simulated
times: one window a second, like the live session, ending shortly before it starts (with a
scheduler's restart gap of ``REPLAY_DOWNTIME_S`` between them).  Stamped with the real clock they
would claim 10–40M tokens/s against the live session's ~55k and squash every throughput chart.

The history is written out of the dashboard's sight, in ``<run>/.history`` (discovery skips a
hidden directory), and a run appears only once the live session holds the writer's lock and has
logged its ``session_start``: its files are renamed into ``RUN_DIR`` then, which the open writer's
descriptors and its lock follow.  Written in place, the history's crashes were real to every
reader: a torn tail with no writer behind it reads ``crashed`` at once, and the demo opened as a
crashed run for the seconds between its replayed sessions (and as ``stalled`` before that, its
records being minutes old by their simulated clock).

Ctrl-C on ``streamlit run`` reaches the whole process group: the trainer then ends its session
as ``interrupted`` (a ``session_end`` record, as ``training_session`` writes) and both processes
exit quietly; SIGTERM (the dashboard exiting) does the same.

The process exits when its parent (the dashboard server) exits: Linux's parent-death signal,
and a check of ``getppid()`` every window for other systems.  It writes only inside ROOT, which
the dashboard keeps in its cache directory, never in the user's runs root.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np

from metrics_core import MetricsWriter, RunContext, TrainingState, TrainingWindow

FP16_MAX = 65504.0
WINDOW = 10  # attempts per train record
MAX_GRAD_NORM = 1.2
WINDOW_S = 1.0  # simulated seconds per window of a replayed session (the live session's pace)
REPLAY_DOWNTIME_S = 30.0  # simulated time between the replayed sessions (a scheduler's restart)
HISTORY_DIR = ".history"  # under a run's directory: where the replayed sessions are written, unseen
LR = 0.05  # the story run's base learning rate (halved every 2,000 steps)
SWEEP = {"lr0.05-seed0": (0.05, 0), "lr0.05-seed1": (0.05, 1), "lr0.02-seed0": (0.02, 0), "lr0.02-seed1": (0.02, 1)}
STORY_RUN = "lr0.05-seed0"  # the run that is killed, resumed twice and trains live
REPLAYED_STEPS = 1500  # the other runs: replayed in a few seconds, then finished
_stop = {"requested": False}


def _request_stop(signum: int, frame: object) -> None:
    """SIGINT/SIGTERM: stop at the next window (never mid-write: a flag, not an exception)."""
    _stop["requested"] = True


def _catch_stop_signals() -> None:
    _stop["requested"] = False
    signal.signal(signal.SIGINT, _request_stop)
    signal.signal(signal.SIGTERM, _request_stop)


class SimulatedClock:
    """A writer clock for replayed history: starts at ``start_ns``, advances ``WINDOW_S`` per ``tick``."""

    def __init__(self, start_ns: int) -> None:
        self.now_ns = start_ns

    def __call__(self) -> int:
        return self.now_ns

    def tick(self) -> None:
        self.now_ns += int(WINDOW_S * 1e9)


class Model:
    """y = W2·tanh(W1·x): enough to give a real, noisy, decreasing loss."""

    def __init__(self, rng: np.random.Generator, width: int = 32, inputs: int = 16) -> None:
        self.w1 = rng.normal(0, 0.5, (inputs, width))
        self.w2 = rng.normal(0, 0.5, (width, 1))

    def loss_and_grads(self, x: np.ndarray, y: np.ndarray) -> tuple[float, list[np.ndarray]]:
        hidden = np.tanh(x @ self.w1)
        error = hidden @ self.w2 - y
        loss = float(np.mean(error**2))
        d_out = 2 * error / len(x)
        grad_w2 = hidden.T @ d_out
        grad_w1 = x.T @ ((d_out @ self.w2.T) * (1 - hidden**2))
        return loss, [grad_w1, grad_w2]

    def params(self) -> list[np.ndarray]:
        return [self.w1, self.w2]


def _batch(rng: np.random.Generator, teacher: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    rows = int(rng.integers(24, 64))  # variable batch: token weighting matters
    x = rng.normal(size=(rows, teacher.shape[0]))
    y = np.sin(x @ teacher) + rng.normal(0, 0.1, (rows, 1))
    return x, y, rows * 128  # 128 "tokens" per example


def _save(directory: Path, step: int, model: Model, state: TrainingState, scale: float) -> Path:
    path = directory / "checkpoints" / f"step-{step:07d}.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(
        tmp, w1=model.w1, w2=model.w2, step=step, tokens=state.tokens_seen, skipped=state.skipped_updates, scale=scale
    )
    os.replace(tmp, path)
    return path


def _parent_gone(parent: int) -> bool:
    return os.getppid() != parent


def run_session(
    directory: Path,
    session: int,
    *,
    resume_from: Path | None,
    stop_at: int,
    pace: float,
    crash: bool,
    seed: int,
    lr: float = LR,
    start_ns: int | None = None,
    publish: bool = False,
) -> None:
    """One process lifetime of the trainer: resume, train to ``stop_at``, then crash or finish.

    It writes the log in ``HISTORY_DIR``, and with ``publish`` moves it into ``directory`` once its
    ``session_start`` is written (``_publish``).  With ``start_ns`` its records carry simulated
    times from then on (a replayed session)."""
    _catch_stop_signals()
    clock = SimulatedClock(start_ns) if start_ns is not None else None
    rng = np.random.default_rng(seed + session)
    teacher = np.random.default_rng(seed).normal(size=(16, 1))
    model, state, scale = Model(np.random.default_rng(seed)), TrainingState(), 2.0**10
    resumed_step = None
    if resume_from is not None:
        saved = np.load(resume_from)
        model.w1, model.w2, scale = saved["w1"], saved["w2"], float(saved["scale"])
        state = TrainingState(int(saved["step"]), int(saved["tokens"]), int(saved["skipped"]))
        resumed_step = state.step
    parent = os.getppid()
    base_lr, window = lr, TrainingWindow()
    writer_clock = {"clock": clock} if clock is not None else {}
    with MetricsWriter(
        RunContext(directory / HISTORY_DIR, directory.name, f"demo-s{session}"), **writer_clock
    ) as writer:
        writer.write("session_start", state, discarded_bytes=writer.discarded_bytes, resumed_from_step=resumed_step)
        writer.write_config(
            state,
            {
                "model": {"inputs": 16, "width": 32},
                "optim": {"lr": base_lr, "lr_half_life_steps": 2000, "max_grad_norm": MAX_GRAD_NORM},
                "fp16": {"initial_scale": 2.0**10},
                "window": WINDOW,
                "seed": seed,
            },
        )
        if publish:
            _publish(writer, directory)
        while state.step < stop_at:
            x, y, tokens = _batch(rng, teacher)
            loss, grads = model.loss_and_grads(x, y)
            scaled_norm = scale * float(np.sqrt(sum(np.sum(g * g) for g in grads)))
            skipped = scaled_norm > FP16_MAX  # the scaled gradient overflowed float16
            grad_norm = scaled_norm / scale
            window.add(loss, tokens, grad_norm, skipped, MAX_GRAD_NORM)
            state.tokens_seen += tokens
            if skipped:
                state.skipped_updates += 1
                scale /= 2
            else:
                clip = min(1.0, MAX_GRAD_NORM / max(grad_norm, 1e-12))
                for param, grad in zip(model.params(), grads, strict=True):
                    param -= lr * clip * grad
                state.step += 1
                if state.step % 50 == 0:
                    scale *= 4  # grow the scale until it overflows again
            if window.attempts < WINDOW:
                continue
            lr = base_lr * (0.5 ** (state.step / 2000))
            if clock is not None:
                clock.tick()
            writer.write("train", state, **window.summary(lr))
            window.reset()
            if state.step % 100 < WINDOW and not skipped:
                vx, vy, vtokens = _batch(np.random.default_rng(seed + 99), teacher)
                writer.write("validation", state, val_loss=model.loss_and_grads(vx, vy)[0], val_tokens=vtokens)
            if state.step % 200 < WINDOW and not skipped:
                writer.write("checkpoint", state, path=str(_save(directory, state.step, model, state, scale).name))
            if pace:
                time.sleep(pace)
            if _parent_gone(parent) or _stop["requested"]:
                writer.write("session_end", state, status="interrupted")
                return
        if crash:
            # Die mid-record, as a SIGKILL during a write would: half a line, no session_end.
            with open(writer.path, "ab") as log:
                log.write(b'{"schema_version":1,"event":"train","step":' + str(state.step).encode())
            os._exit(1)
        writer.write("session_end", state, status="finished")


def _publish(writer: MetricsWriter, directory: Path) -> None:
    """Move the open writer's log and failure note from ``HISTORY_DIR`` into ``directory``: the
    run appears whole, its writer's lock already held (a lock belongs to the open file, which a
    rename does not touch) and its latest record this session's start.  The note goes first, so
    the run never appears without it; the writer's paths then name the files where they are."""
    note, log = directory / writer.note_path.name, directory / writer.path.name
    os.replace(writer.note_path, note)
    os.replace(writer.path, log)
    writer.note_path, writer.path = note, log
    os.rmdir(directory / HISTORY_DIR)


def _latest_checkpoint(directory: Path, before: int) -> Path:
    checkpoints = sorted((directory / "checkpoints").glob("step-*.npz"))
    eligible = [path for path in checkpoints if int(path.stem.split("-")[1]) <= before]
    return eligible[-1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="where the sweep's runs are written (a trainer: its run)")
    parser.add_argument("--steps", type=int, default=20_000, help="steps of the live run's last session")
    parser.add_argument("--pace", type=float, default=1.0, help="seconds between live windows")
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--lr", type=float, default=LR, help=argparse.SUPPRESS)
    parser.add_argument("--session", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--resume", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--stop-at", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--crash", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--start-ns", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--publish", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.session is not None:  # one trainer process (a child of the supervisor below)
        run_session(
            args.root,
            args.session,
            resume_from=args.resume,
            stop_at=args.stop_at,
            pace=args.pace,
            crash=args.crash,
            seed=args.seed,
            lr=args.lr,
            start_ns=args.start_ns,
            publish=args.publish,
        )
        return
    _catch_stop_signals()
    # Supervisor: the sweep's trainers, the live run's three one after the other, like a job
    # scheduler restarting a preempted job.  It watches its own parent (the dashboard) by polling:
    # PR_SET_PDEATHSIG would fire when the *thread* that started it ends, and Streamlit starts it
    # from a short-lived script thread.
    supervisor_parent = os.getppid()
    steps = min(args.steps, REPLAYED_STEPS)
    replayed = []
    for name, (lr, seed) in SWEEP.items():
        if name != STORY_RUN:
            start_ns = time.time_ns() - _replay_ns(steps)
            command = _trainer(args.root / name, 1, steps, 0.0, seed=seed, lr=lr, start_ns=start_ns)
            replayed.append(subprocess.Popen([*command, "--publish"], preexec_fn=die_with_parent))
    stopped = _story(args.root / STORY_RUN, args.steps, args.pace, supervisor_parent)
    for trainer in replayed:
        if stopped:
            trainer.terminate()  # SIGTERM: it ends its session as interrupted
        trainer.wait()


def _trainer(
    run_dir: Path, session: int, stop_at: int, pace: float, *, seed: int, lr: float, start_ns: int | None
) -> list[str]:
    """The command of one trainer process (``run_session``)."""
    command = [sys.executable, "-m", "metrics_core.dashboard.demo", str(run_dir), "--session", str(session)]
    command += ["--stop-at", str(stop_at), "--pace", str(pace), "--seed", str(seed), "--lr", str(lr)]
    return command if start_ns is None else [*command, "--start-ns", str(min(start_ns, time.time_ns()))]


def _replay_ns(steps: int) -> int:
    """How long ``steps`` take at the live pace, in simulated nanoseconds: ~one window per 7.5 steps
    (skipped attempts make windows of fewer than 10 steps: about 8)."""
    return int(steps / 7.5 * WINDOW_S * 1e9)


def _story(run_dir: Path, steps: int, pace: float, supervisor_parent: int) -> bool:
    """The live run: two sessions replayed, each killed mid-record, then the live one, resumed from
    an older checkpoint each time.  Whether it was stopped (the dashboard gone, SIGTERM)."""
    shutil.rmtree(run_dir / HISTORY_DIR, ignore_errors=True)  # a history a stopped demo left half written
    plan = [(1, None, 600, 0.0, True), (2, 400, 1200, 0.0, True), (3, 1000, steps, pace, False)]
    # The replayed sessions' simulated history ends about when the live session starts, so the
    # live session rarely has to wait for the simulated history to pass.
    start_ns = time.time_ns() - _replay_ns(600 + 800) - int(REPLAY_DOWNTIME_S * 1e9)
    for session, resume_below, stop_at, session_pace, crash in plan:
        if session_pace and session > 1:
            start_ns = None  # live: the real clock
        elif session > 1:  # replayed: simulated times, after the previous session's last record
            start_ns = _last_record_ns(run_dir / HISTORY_DIR) + int(REPLAY_DOWNTIME_S * 1e9)
        command = _trainer(run_dir, session, stop_at, session_pace, seed=SWEEP[STORY_RUN][1], lr=LR, start_ns=start_ns)
        if resume_below is not None:
            command += ["--resume", str(_latest_checkpoint(run_dir, resume_below))]
        command.append("--crash" if crash else "--publish")  # the last session shows the run, its history behind it
        trainer = subprocess.Popen(command, preexec_fn=die_with_parent)
        while trainer.poll() is None:
            if _parent_gone(supervisor_parent) or _stop["requested"]:
                trainer.terminate()  # SIGTERM: it ends its session as interrupted
                trainer.wait()
                return True
            time.sleep(0.2)
        if _stop["requested"]:
            return True
        if crash:  # the next session must start after the simulated history it follows
            while _last_record_ns(run_dir / HISTORY_DIR) >= time.time_ns() and not _stop["requested"]:
                time.sleep(0.2)
    return _stop["requested"]


def _last_record_ns(directory: Path) -> int:
    """The time of the last complete record of the run (nanoseconds since the epoch)."""
    with open(directory / "metrics.jsonl", "rb") as file:
        file.seek(max(0, file.seek(0, os.SEEK_END) - 65536))
        lines = file.read().split(b"\n")
    for line in reversed(lines[:-1]):  # the last piece is a torn tail or empty
        try:
            stamp = json.loads(line)["time"]
        except (ValueError, KeyError, TypeError):
            continue
        return int(datetime.fromisoformat(stamp).timestamp() * 1e9)
    return time.time_ns()


def die_with_parent() -> None:
    """In a child before exec: get SIGTERM when the parent's (single) thread dies (Linux)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (AttributeError, OSError):
        pass


def start_demo(root: Path) -> subprocess.Popen:
    """Start the demo supervisor writing its sweep under ``root``; it exits when this process does."""
    return subprocess.Popen(
        [sys.executable, "-m", "metrics_core.dashboard.demo", str(root)],
        stdout=subprocess.DEVNULL,
    )


if __name__ == "__main__":
    main()
