"""Where runs live: run discovery, the runs root a store talks to (a directory or a bucket prefix), its watcher."""
