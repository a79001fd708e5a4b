"""``servelab route`` under load on this machine: what the router costs, and what prefix affinity buys.

    python benchmarks/route_load.py                        # both parts, the default rates
    python benchmarks/route_load.py --rates 2 4 8 --requests 40 --part load
    python benchmarks/route_load.py --part prefix

Two ``model=tiny_code`` replicas (``servelab serve``, one torch thread each) are started once. A
Poisson load generator (``openai.AsyncOpenAI``, streamed completions, ``ignore_eos``, fixed
``max_tokens``) measures at each rate, per setup:

- ``one``: one replica, the client talking to it directly;
- ``direct2``: both replicas, the client alternating between them itself (client-side round robin);
- ``route2``: both replicas behind ``servelab route router=round_robin`` (its own process).

It prints output throughput (tokens/s over the run's span) and TTFT / ITL percentiles (ms, from the
client's receipt times). ``route2`` - ``direct2`` is the router's own cost per request; it is also measured without load first
(one client, each request sent when the previous one ended: median TTFT and end-to-end latency).
``--part prefix``: a shared-prefix workload (4 system prompts of ~250 tokens, each request one of
them + a short question) through ``servelab route`` with ``prefix_affinity`` and with ``round_robin``,
the replicas' prefix caches on (``allocator.prefix_caching=true``, 48 KV blocks of 16 each: room for
about two of the four prompts); the hit rate is read from the replicas' ``/metrics``
(``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``, deltas over the run). Each policy's run
uses its own ``cache_salt`` so the other's cached blocks do not count.

Everything (replicas, router, load generator) shares this machine's cores: with 2 cores the replicas
compete with the router and the client, so the figures are the router's cost on a loaded box, not on
a dedicated one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import openai

from servelab.serve.route.launch import start_replicas, stop_replicas

REPLICA = ["model=tiny_code", "logger=none", "backend.num_threads=1", "allocator.prefix_caching=true",
           "num_kv_blocks=48", "max_num_seqs=16"]
CODE_LINES = ["import os", "import sys", "def main(argv):", "    for name in argv:", "        print(name)",
              "class Table:", "    def __init__(self, rows):", "        self.rows = list(rows)", "    return 0"]


def prompt(rng: np.random.Generator, words: int = 4) -> str:
    return "\n".join(rng.choice(CODE_LINES, size=words)) + "\n"


async def one_request(client: openai.AsyncOpenAI, text: str, max_tokens: int, salt: str | None) -> dict:
    sent = time.perf_counter()
    times = []
    extra = {"ignore_eos": True, **({"cache_salt": salt} if salt else {})}
    stream = await client.completions.create(model="tiny_code", prompt=text, max_tokens=max_tokens, stream=True,
                                             temperature=0, extra_body=extra)
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            times.append(time.perf_counter())
    return {"sent": sent, "times": times}


async def drive(urls: list[str], rate: float, n: int, max_tokens: int, seed: int, prompts: list[str],
                salt: str | None = None) -> list[dict]:
    """``n`` requests at Poisson ``rate``, request ``i`` to ``urls[i % len(urls)]``."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1 / rate, size=n)
    clients = [openai.AsyncOpenAI(base_url=f"{u}/v1", api_key="x", max_retries=0, timeout=300,
                                  http_client=httpx.AsyncClient(limits=httpx.Limits(max_connections=None)))
               for u in urls]
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(one_request(clients[i % len(clients)], prompts[i], max_tokens, salt)))
        await asyncio.sleep(gaps[i])
    results = await asyncio.gather(*tasks)
    for c in clients:
        await c.close()
    return results


async def one_at_a_time(urls: list[str], n: int, max_tokens: int, prompts: list[str]) -> list[dict]:
    """``n`` requests, each sent when the previous one ended (one client): latency without queueing."""
    clients = [openai.AsyncOpenAI(base_url=f"{u}/v1", api_key="x", max_retries=0, timeout=300) for u in urls]
    results = [await one_request(clients[i % len(clients)], prompts[i], max_tokens, None) for i in range(n)]
    for c in clients:
        await c.close()
    return results


def figures(results: list[dict]) -> dict:
    ttft = [(r["times"][0] - r["sent"]) * 1e3 for r in results if r["times"]]
    itl = [g * 1e3 for r in results for g in np.diff(r["times"])]
    start = min(r["sent"] for r in results)
    end = max(r["times"][-1] for r in results if r["times"])
    tokens = sum(len(r["times"]) for r in results)
    p = np.percentile
    return {"tok_s": tokens / (end - start), "ttft_p50": p(ttft, 50), "ttft_p99": p(ttft, 99),
            "itl_p50": p(itl, 50), "itl_p99": p(itl, 99)}


def start_router(backends: list[str], router: str) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-c", "from servelab.cli.main import main; main()", "route", "--port", "0",
           f"route.backends=[{','.join(backends)}]", f"router={router}", "model=tiny_code", "logger=none"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    for line in proc.stdout:
        match = re.search(r"listening on (http://[\d.]+:\d+)", line)
        if match:
            return proc, match.group(1)
    raise RuntimeError(f"servelab route did not start (exit {proc.wait()})")


def stop_router(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    proc.wait(60)


def prefix_counts(urls: list[str]) -> tuple[float, float]:
    hits = queries = 0.0
    for u in urls:
        for line in httpx.get(f"{u}/metrics").text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                hits += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_queries_total"):
                queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


def load_part(urls: list[str], rates: list[float], n: int, max_tokens: int) -> None:
    rng = np.random.default_rng(0)
    prompts = [prompt(rng) for _ in range(n)]
    router, route_url = start_router(urls, "round_robin")
    try:
        latency = {}
        for setup, targets in (("direct2", urls), ("route2", [route_url])):
            results = asyncio.run(one_at_a_time(targets, n, max_tokens, prompts))
            latency[setup] = (np.median([(r["times"][0] - r["sent"]) * 1e3 for r in results]),
                              np.median([(r["times"][-1] - r["sent"]) * 1e3 for r in results]))
        print(f"one client, {n} requests one after another: median TTFT / e2e direct {latency['direct2'][0]:.1f} / "
              f"{latency['direct2'][1]:.1f} ms, through the router {latency['route2'][0]:.1f} / "
              f"{latency['route2'][1]:.1f} ms", flush=True)
        print(f"{'setup':8} {'rate':>5} {'tok/s':>7} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8}")
        for rate in rates:
            for setup, targets in (("one", urls[:1]), ("direct2", urls), ("route2", [route_url])):
                f = figures(asyncio.run(drive(targets, rate, n, max_tokens, int(rate * 100), prompts)))
                print(f"{setup:8} {rate:5g} {f['tok_s']:7.1f} {f['ttft_p50']:9.1f} {f['ttft_p99']:9.1f} "
                      f"{f['itl_p50']:8.1f} {f['itl_p99']:8.1f}", flush=True)
    finally:
        stop_router(router)


def prefix_part(urls: list[str], n: int, rate: float) -> None:
    rng = np.random.default_rng(1)
    systems = [f"# system prompt {k}\n" + prompt(rng, words=12) for k in range(4)]
    prompts = [systems[rng.integers(4)] + f"# question {i}\n" for i in range(n)]
    for router in ("prefix_affinity", "round_robin"):
        proc, route_url = start_router(urls, router)
        try:
            hits0, queries0 = prefix_counts(urls)
            asyncio.run(drive([route_url], rate, n, 4, 7, prompts, salt=router))
            time.sleep(0.5)
            hits, queries = prefix_counts(urls)
            print(f"{router:16} prefix-cache hit rate {(hits - hits0) / (queries - queries0):.3f} "
                  f"({hits - hits0:.0f} of {queries - queries0:.0f} prompt tokens, {n} requests at {rate:g}/s)",
                  flush=True)
        finally:
            stop_router(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("load", "prefix", "both"), default="both")
    ap.add_argument("--rates", type=float, nargs="+", default=[2.0, 4.0, 8.0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    replicas = start_replicas(2, REPLICA, Path(tempfile.mkdtemp(prefix="route-load-")), timeout_s=180)
    urls = [r.url for r in replicas]
    print(f"replicas: {urls} ({' '.join(REPLICA)}); {os.cpu_count()} CPUs", flush=True)
    try:
        if args.part in ("load", "both"):
            load_part(urls, args.rates, args.requests, args.max_tokens)
        if args.part in ("prefix", "both"):
            prefix_part(urls, 2 * args.requests, 4.0)
    finally:
        stop_replicas(replicas)


if __name__ == "__main__":
    main()
