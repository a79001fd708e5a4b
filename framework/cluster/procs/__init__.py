"""A wall-clock cluster: one engine process per replica (``engine``: the child's loop), the parent's
record of each (``replica``) and the parent's loop with the router (``cluster``); live migration between
the processes: the parent's side (``migration``) and each child's (``migrate_child``)."""
