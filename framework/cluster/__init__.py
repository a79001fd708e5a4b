"""More than one engine: replicas behind a router, colocated or prefill/decode disaggregated
(docs/cluster.md). ``protocol``: placement, the prefill->decode hand-off, the router's books and what
a router sees, written once; ``router``: the router plugin, built through the kinds table. Its drivers:
``simulated``, one discrete-event loop on the virtual clock; ``procs/``, one engine process per replica
on the wall clock; and ``servelab route`` (:mod:`servelab.serve.route`), real servers over HTTP.
``build``: a simulated cluster from a config; ``migration``: live migration of running requests between
the simulator's replicas, asked of the ``migration_policy`` plugin (``procs/migration``: between engine
processes). The KV hand-off between replicas is a KV connector (:mod:`servelab.kv.pd`), and so is a
migration's (:mod:`servelab.kv.migrate_sim`, :mod:`servelab.kv.migrate_proc`)."""
