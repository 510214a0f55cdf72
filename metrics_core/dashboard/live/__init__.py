"""The live page: the chart component, the long poll that feeds it, and what each answer holds."""
