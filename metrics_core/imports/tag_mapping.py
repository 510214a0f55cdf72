"""Which record and key a logged name (a TensorBoard tag, a CSV column) becomes.

Names that other tools give the quantities the dashboard charts by default land on the product's
own fields (``train/loss`` -> ``train_loss`` of a ``train`` record, ``eval/loss`` -> ``val_loss``
of a ``validation`` record); a name under an evaluation prefix (``eval/``, ``val/``,
``validation/``) is a value of the ``validation`` record at its step; every other name is a
logged key of the ``train`` record, kept as written.  A name that is a base field of the record
contract (``step``, ``time`` ...) is kept under ``imported/<name>``, as the writer refuses it.
"""

from __future__ import annotations

from metrics_core.write.writer import BASE_FIELDS

TRAIN, VALIDATION = "train", "validation"

# Spellings of the default charts' fields in TensorBoard callbacks (Hugging Face's ``train/…``,
# Lightning's and hand-written loops' bare names, the Keras/torch ``Loss/train`` habit).
_FIELDS = {
    "train_loss": ("loss", "train/loss", "train_loss", "training/loss", "training_loss", "loss/train", "Loss/train"),
    "lr": ("lr", "learning_rate", "train/learning_rate", "train/lr", "lr/train", "learning-rate"),
    "grad_norm_avg": ("grad_norm", "train/grad_norm", "gradient_norm", "train/gradient_norm"),
    "val_loss": (
        "val_loss", "eval/loss", "eval_loss", "validation/loss", "val/loss", "valid/loss", "loss/val",
        "Loss/val", "Loss/validation", "validation_loss",
    ),
}  # fmt: skip
_KNOWN = {name: field for field, names in _FIELDS.items() for name in names}
_VALIDATION_PREFIXES = ("eval/", "val/", "validation/", "valid/")
RENAMED_PREFIX = "imported/"


def destination(name: str) -> tuple[str, str]:
    """``(event, key)`` for the logged ``name`` (module docstring)."""
    field = _KNOWN.get(name)
    if field is not None:
        return (VALIDATION if field == "val_loss" else TRAIN), field
    event = VALIDATION if name.startswith(_VALIDATION_PREFIXES) else TRAIN
    if name in BASE_FIELDS:
        return event, RENAMED_PREFIX + name
    return event, name
