"""SQL over every run: the Parquet export and DuckDB over it."""
