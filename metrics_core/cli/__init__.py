"""The terminal tools: one module per subcommand of ``python -m metrics_core``."""
