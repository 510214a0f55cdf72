"""Framework integrations: record a Hugging Face ``Trainer`` or a Lightning ``Trainer`` run as-is.

``metrics_core.integrations.hf`` (transformers) and ``metrics_core.integrations.lightning``
(PyTorch Lightning) are imported explicitly by the training script; this package imports neither,
and ``import metrics_core`` never loads a framework: neither is a dependency of the package.

Both keep the contract of ``metrics_core.write.training_session``: ``session_start`` with the torn bytes a crash
left and the step the run resumed from, ``train`` / ``validation`` / ``checkpoint`` records with
the counters of docs/FORMAT.md, the run's configuration as one ``config`` record, and a
``session_end`` (``finished``, ``failed`` or ``interrupted``) whenever the process gets to write it.
"""
