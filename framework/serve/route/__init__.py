"""``servelab route``: an OpenAI-compatible router running a router plugin in front of N servers: the
application (``app``), its backends (``backends``), start-up of replica servers (``launch``), its
Prometheus metrics (``metrics``) and the command (``command``)."""
