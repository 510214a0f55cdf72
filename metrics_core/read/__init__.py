"""The read core: a run file's bytes to records, sessions and columns, incrementally."""
