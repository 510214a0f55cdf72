"""Who is asking the dashboard: the sessions handed to browsers, the wrong-token waits per client,
and the user of this host behind a loopback connection.  Plain Python, no Streamlit: the access
check behind the fence (``server/access``) keeps its state here."""
