"""What the tests (tests/) and the benchmarks (benchmarks/) both use, in one place so that neither
imports the other, as ``numpy.testing`` serves numpy's: a served dashboard and a headless Chromium
(``live_server``), buckets and their emulators (``buckets``), hand-crafted records (``records``),
realistic generated runs (``generate``), and the package installed from its wheel (``wheel_venv``).
The top layer of the package: nothing else in it imports this, and ``import metrics_core`` never
loads it.  It drives a served dashboard from outside, as a browser does, so it names Streamlit's
URL paths (its health check) without leaning on its internals."""
