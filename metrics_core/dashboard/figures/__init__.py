"""Figures as plotly's JSON structure in plain dicts, drawn from the views' chart specs, and memoised per snapshot."""
