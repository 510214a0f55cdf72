"""What the tests (tests/) and the benchmarks (benchmarks/) both use, in one place so that neither
imports the other: a served dashboard and a headless Chromium (``live_server``), buckets and their
emulators (``buckets``), hand-crafted records (``records``), realistic generated runs
(``generate``), and the package installed from its wheel (``wheel_venv``).  Not part of the package:
pyproject.toml lists the packages a wheel holds, and this is not one of them."""
