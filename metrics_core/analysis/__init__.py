"""Quantities and checks derived from what the readers hand out (pandas)."""
