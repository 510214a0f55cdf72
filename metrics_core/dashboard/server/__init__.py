"""Every Streamlit internal the dashboard leans on, fenced here behind one switch (``METRICS_SERVE_PLAIN=1``)."""
