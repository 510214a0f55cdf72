"""Other tools' logs as runs: TensorBoard event files and CSV tables, written through the write
side's own ``MetricsWriter``, so an imported run is exactly what the dashboard reads.

``tag_mapping`` (a logged name to the product's field), ``event_files`` (TensorBoard's own loader,
the optional ``tensorboard`` extra, behind one module), ``import_state`` (what was imported, per
run, so importing again adds nothing), ``session_sink`` (scalars to records of one session),
``tensorboard_import`` (a logdir to runs, its event files to sessions, once or following) and
``csv_import`` (a table to a run).  The training side and the dashboard never import this package.
"""
