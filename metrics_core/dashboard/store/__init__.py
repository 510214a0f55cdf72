"""The server-wide run registry: runs, their readers, and the immutable snapshots pages get."""
