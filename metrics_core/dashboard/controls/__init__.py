"""Sidebar controls that live in the URL, so that a link reopens the view its sender saw:
``url_state`` (each control seeded from its parameter and written back, and the run and compare
pages' shared smoothing and log-y), ``compare`` (the compare page's chart controls)."""
