"""Runs in object storage: bucket addresses, how an object's bytes are fetched, runs as parts, sync."""
