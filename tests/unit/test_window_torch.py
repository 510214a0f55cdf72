"""TrainingWindow with 0-d torch tensors: no host sync in add(), same summaries as the float path."""

from __future__ import annotations

import math
import random

import pytest

from metrics_core import TrainingWindow

torch = pytest.importorskip(
    "torch", reason="the PyTorch CPU build is not installed (.ci/run: pip install torch==2.13.0)"
)
TorchFunctionMode = torch.overrides.TorchFunctionMode

HOST_TRANSFERS = {"item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__", "cpu"}


class HostTransferSpy(TorchFunctionMode):
    """Records every tensor method that moves a value to the host (a device sync on a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in HOST_TRANSFERS:
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


def attempts(seed: int = 0, count: int = 40) -> list[tuple[float, int, float, bool]]:
    rng = random.Random(seed)
    result = []
    for _ in range(count):
        skipped = rng.random() < 0.2
        norm = math.inf if skipped else rng.choice([rng.uniform(0.1, 2.0), rng.uniform(0.1, 2.0), math.nan])
        result.append((rng.uniform(1.0, 4.0), rng.randint(50, 500), norm, skipped))
    return result


def test_spy_sees_host_transfers() -> None:
    """The spy itself works: .item(), bool() and float() on a tensor are recorded."""
    value = torch.tensor(1.5)
    with HostTransferSpy() as spy:
        value.item()
        bool(value > 1)
        float(value)
    assert {"item", "__bool__", "__float__"} <= set(spy.calls)


def test_add_with_tensors_makes_no_host_transfer() -> None:
    """add() with tensor loss, grad norm and skipped flag never converts a tensor to a Python value."""
    window = TrainingWindow()
    with HostTransferSpy() as spy:
        for loss, tokens, norm, skipped in attempts():
            window.add(torch.tensor(loss), tokens, torch.tensor(norm), torch.tensor(skipped), 1.0)
    assert spy.calls == []
    with HostTransferSpy() as spy:
        window.summary(1e-3)
    assert spy.calls == ["tolist"]  # the single transfer, once per window


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tensor_summaries_equal_the_float_path(seed: int) -> None:
    """The same attempts as floats and as tensors give the same summary."""
    floats, tensors = TrainingWindow(), TrainingWindow()
    for loss, tokens, norm, skipped in attempts(seed):
        floats.add(loss, tokens, norm, skipped, 1.0)
        tensors.add(torch.tensor(loss, dtype=torch.float32), tokens, torch.tensor(norm), torch.tensor(skipped), 1.0)
    expected, got = floats.summary(2e-4), tensors.summary(2e-4)
    assert got.keys() == expected.keys()
    for key in expected:
        assert got[key] == pytest.approx(expected[key], rel=1e-6), key
    assert isinstance(got["updates"], int) and isinstance(got["train_loss"], float)


def test_mixed_python_and_tensor_attempts_add_up() -> None:
    """Float attempts and tensor attempts in one window are combined."""
    mixed, floats = TrainingWindow(), TrainingWindow()
    mixed.add(2.0, 100, 0.5, False, 1.0)
    mixed.add(torch.tensor(4.0), 300, torch.tensor(1.5), False, 1.0)
    mixed.add(torch.tensor(3.0), 100, None, torch.tensor(True), 1.0)
    for args in ((2.0, 100, 0.5, False, 1.0), (4.0, 300, 1.5, False, 1.0), (3.0, 100, None, True, 1.0)):
        floats.add(*args)
    assert mixed.summary(1.0) == pytest.approx(floats.summary(1.0))


def test_nonfinite_tensor_loss_is_reported_at_summary() -> None:
    """A NaN tensor loss (not checked in add(), which would sync) is reported by summary() as floats are."""
    tensors, floats = TrainingWindow(), TrainingWindow()
    tensors.add(torch.tensor(1.0), 10, torch.tensor(1.0), torch.tensor(False), 1.0)
    tensors.add(torch.tensor(math.nan), 10, torch.tensor(1.0), torch.tensor(False), 1.0)
    floats.add(1.0, 10, 1.0, False, 1.0)
    floats.add(math.nan, 10, 1.0, False, 1.0)
    summary = tensors.summary(1.0)
    assert summary["train_loss"] is None and summary["nonfinite_loss"] is True
    assert summary == floats.summary(1.0)


def test_reset_clears_device_attempts() -> None:
    """After reset the kept tensor attempts are gone too."""
    window = TrainingWindow()
    window.add(torch.tensor(1.0), 10, torch.tensor(1.0), torch.tensor(False), 1.0)
    window.reset()
    assert window.summary(1.0) == TrainingWindow().summary(1.0)
