"""The write side: what a training process imports (orjson and the standard library only)."""
