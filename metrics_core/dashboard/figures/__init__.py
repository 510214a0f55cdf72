"""Figures as plotly's JSON structure in plain dicts: pure functions, no plotly import."""
