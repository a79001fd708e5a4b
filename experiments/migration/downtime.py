"""Migration downtime and bytes against request length, with pre-copy and without.

    python experiments/migration/downtime.py            # prints the markdown table
    python experiments/migration/downtime.py --quick    # two lengths (the tests)

One Llama-3-70B request (TP 4 per replica, simulated H100s, bf16 KV: 327,680 bytes per token) decodes on
replica 0 of a 2-replica colocated cluster among ``--background`` other decoding requests; one interval
after it starts decoding a scripted policy moves it to replica 1, across nodes (``cluster.kv_link=
inter_node``: 4 lanes of 50 GB/s) or within one (``intra_node``: 4 lanes of 450 GB/s). Per prompt length:
the bytes copied, the pre-copy stages, and the downtime (stop-and-copy), with ``cluster.migration_precopy``
on and off. The tokens of every run equal the run without migration (checked).
"""

from __future__ import annotations

import argparse

from servelab.api import compose
from servelab.cluster.build import build_cluster
from servelab.core.migration_policy import Migrate, MigrationPolicy
from servelab.core.contexts import MigrationPolicyContext
from servelab.core.request import Request

BASE = ["backend=sim", "model=llama3_70b", "hardware=h100", "tensor_parallel_size=4", "cluster.replicas=2",
        "migration_policy=drain", "cluster.migration_interval_s=0.5", "max_model_len=65536"]
LENGTHS = (1024, 4096, 16384, 32768)


class MoveOnce(MigrationPolicy):
    """Moves request ``rid`` to replica 1 at the first question it is decoding on replica 0."""

    name = "move_once"

    def __init__(self, rid: str) -> None:
        super().__init__(None, MigrationPolicyContext(2))
        self.rid, self.done = rid, False

    def decide(self, replicas, now):
        if self.done or not any(q.id == self.rid for q in replicas[0].running):
            return []
        self.done = True
        return [Migrate(self.rid, 1)]


def run(prompt: int, precopy: bool, link: str, background: int):
    cfg = compose([*BASE, f"cluster.kv_link={link}", f"cluster.migration_precopy={str(precopy).lower()}"],
                  logger="none", progress=False)
    cluster, _ = build_cluster(cfg)
    cluster.migration.policy = MoveOnce("long")
    requests = [Request("long", tuple(range(1, prompt + 1)), 512)]
    requests += [Request(f"bg{i}", tuple(range(100_000 + 1000 * i, 100_000 + 1000 * i + 512)), 2048, 0.0)
                 for i in range(background)]
    ended = []
    cluster.request_listeners.append(ended.append)
    cluster.run(requests)
    (m,) = [m for m in cluster.migration.sums.done if m.request_id == "long"]
    return m, {s.id: (tuple(s.output_token_ids), s.finish_reason) for s in ended}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--background", type=int, default=8, help="other decoding requests on replica 0")
    args = p.parse_args(argv)
    lengths = LENGTHS[:2] if args.quick else LENGTHS
    print("| link | prompt tokens | KV at move (MB) | pre-copy: stages | bytes (MB) | downtime (ms) | "
          "stop-and-copy only: bytes (MB) | downtime (ms) |")
    print("|---|---|---|---|---|---|---|---|")
    for link in ("inter_node", "intra_node"):
        for prompt in lengths:
            on, tokens_on = run(prompt, True, link, args.background)
            off, tokens_off = run(prompt, False, link, args.background)
            assert tokens_on == tokens_off, "a migration changed the tokens"
            print(f"| {link} | {prompt} | {off.nbytes / 1e6:.0f} | {on.num_stages} | {on.nbytes / 1e6:.0f} | "
                  f"{on.downtime_s * 1e3:.3f} | {off.nbytes / 1e6:.0f} | {off.downtime_s * 1e3:.3f} |")


if __name__ == "__main__":
    main()
