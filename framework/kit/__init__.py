"""The plugin kit: the conformance kit (``check-plugin``), test doubles, grading, and the
``new-plugin`` templates. Plugin tests import them through :mod:`servelab.testing`."""
