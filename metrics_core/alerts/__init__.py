"""Alerts: rules as running state, webhook delivery, the evaluator over a root."""
