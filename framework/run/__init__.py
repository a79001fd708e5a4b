"""The job drivers: one job end to end (``session``: build, run, write, log), the loop that feeds an
engine its workload (``runner``), and a cluster job (``cluster_run``: on the virtual clock one loop; on
the wall clock engine processes, ``process_cluster``). What they build is :mod:`servelab.assemble`'s,
what they write :mod:`servelab.results`', the replicas :mod:`servelab.cluster`'s."""
