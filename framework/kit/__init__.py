"""The plugin kit: the conformance kit (``check-plugin``; routers through synthetic clusters, then
simulated ones), test doubles, grading (``grade``: fixed workloads in the simulator, routers on a
simulated 4-replica cluster), and the ``new-plugin`` templates. Plugin tests import them through
:mod:`servelab.testing`."""
