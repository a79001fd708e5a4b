"""What servelab's own server (``servelab serve``) spends outside the engine's steps, on this CPU:
the figures of the ``frontend=servelab_cpu`` preset (conf/frontend/servelab_cpu.yaml).

    python benchmarks/frontend_cost.py                 # model=tiny_code, backend.num_threads=1
    python benchmarks/frontend_cost.py --repeats 30 --tokens 128 --json out.json

Measured, each a median over ``--repeats``:

- tokenise: the packaged tokenizer's ``encode`` (behind the server's lock, :class:`TextCodec`) on
  prompts of 64 .. 1024 tokens of the held-out corpus; a least-squares line gives a per-prompt-token
  cost and a per-request intercept;
- detokenise: per output token, as the server's engine thread does it (the whole output decoded
  again after every step, :meth:`EngineLoop._emit`), over a ``--tokens``-token output;
- HTTP + JSON per request: a real server in a subprocess; a non-streaming completion of one token
  with a token-id prompt (no tokenising), the client's round trip minus the engine's own E2E for
  that request (``requests.jsonl``: from the handler's arrival stamp to the token's step end);
- SSE per streamed token: the client's wall time of a streamed completion of ``--tokens`` tokens
  minus that of the same completion unstreamed (the same engine work), per token, medians over
  ``--repeats`` interleaved pairs (the server process's CPU time over them, ``/proc/<pid>/stat``, is
  reported beside it: with 10 ms ticks and the engine's own CPU in it, it is the noisier of the two);
- the engine's own decode step (median inter-token latency in ``requests.jsonl``), to compare.

The preset then holds ``per_request_s`` = HTTP + JSON + the tokenise intercept, ``per_prompt_token_s``
= the tokenise slope, ``per_output_token_s`` = detokenise + SSE per token, and
``in_engine_process=true``: the server is one Python process whose engine thread detokenises and
whose event loop shares the GIL with it (docs/simulator.md "Engine timing features").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

DEFAULTS = ("model=tiny_code", "logger=none", "backend.num_threads=1")


def tokenizer_costs(repeats: int, out_tokens: int) -> dict:
    from servelab.api import compose
    from servelab.serve.app import TextCodec
    from servelab.workloads.text import checkpoint_text

    cfg = compose(list(DEFAULTS), logger="none")
    codec = TextCodec(checkpoint_text(cfg))
    corpus = (Path(__file__).resolve().parents[1] / "framework" / "run" / "config.py").read_text()  # plain Python text
    ids = codec.encode(corpus)
    lengths, times = [], []
    for n in (64, 128, 256, 512, 1024):
        text = codec.decode(ids[:n])
        real = len(codec.encode(text))
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            codec.encode(text)
            samples.append(time.perf_counter() - t0)
        lengths.append(real)
        times.append(float(np.median(samples)))
    slope, intercept = np.polyfit(lengths, times, 1)
    output = ids[:out_tokens]
    per_token = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for k in range(1, len(output) + 1):
            codec.decode(output[:k])
        per_token.append((time.perf_counter() - t0) / len(output))
    return {"tokenise_points": [[n, t] for n, t in zip(lengths, times)], "tokenise_per_token_s": float(slope),
            "tokenise_intercept_s": float(max(intercept, 0.0)), "detokenise_per_token_s": float(np.median(per_token))}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def server_costs(repeats: int, out_tokens: int) -> dict:
    import httpx

    with tempfile.TemporaryDirectory(prefix="servelab-frontend-") as tmp:
        out = Path(tmp) / "serve"
        cmd = [sys.executable, "-c", "from servelab.cli.main import main; main()", "serve", "--port", "0",
               *DEFAULTS, f"serve.output_dir={out}"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
        url = {}
        ready = threading.Event()

        def read() -> None:
            for line in proc.stdout:
                m = re.search(r"listening on (http://[\d.]+:\d+)", line)
                if m:
                    url["base"] = m.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(300) or "base" not in url:
            proc.kill()
            raise SystemExit("servelab serve did not start")
        prompt = list(range(100, 132))  # 32 token ids: no tokenising on the server
        client_one: dict[str, float] = {}
        cpu: dict[str, list[float]] = {"plain": [], "stream": []}
        wall: dict[str, list[float]] = {"plain": [], "stream": []}
        with httpx.Client(base_url=url["base"], timeout=300) as client:
            body = {"model": "tiny_code", "prompt": prompt, "ignore_eos": True}
            client.post("/v1/completions", json={**body, "max_tokens": 4})  # warm-up
            for _ in range(repeats):
                t0 = time.perf_counter()
                r = client.post("/v1/completions", json={**body, "max_tokens": 1})
                client_one[r.json()["id"]] = time.perf_counter() - t0
            for _ in range(repeats):
                for kind in ("plain", "stream"):
                    c0, t0 = _cpu_s(proc.pid), time.perf_counter()
                    if kind == "plain":
                        client.post("/v1/completions", json={**body, "max_tokens": out_tokens})
                    else:
                        with client.stream("POST", "/v1/completions",
                                           json={**body, "max_tokens": out_tokens, "stream": True}) as s:
                            for _ in s.iter_lines():
                                pass
                    cpu[kind].append(_cpu_s(proc.pid) - c0)
                    wall[kind].append(time.perf_counter() - t0)
        proc.send_signal(signal.SIGINT)
        proc.wait(120)
        records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    engine_e2e = {r["id"]: r["e2e_ms"] / 1e3 for r in records}
    http = [client_one[i] - engine_e2e[i] for i in client_one if i in engine_e2e]
    itl = [x / 1e3 for r in records if r["output_len"] == out_tokens for x in r["itl_ms"]]
    sse_wall = (float(np.median(wall["stream"])) - float(np.median(wall["plain"]))) / out_tokens
    sse_cpu = (float(np.sum(cpu["stream"])) - float(np.sum(cpu["plain"]))) / (repeats * out_tokens)
    return {"http_json_per_request_s": float(np.median(http)), "sse_per_streamed_token_s": max(sse_wall, 0.0),
            "sse_per_streamed_token_cpu_s": sse_cpu, "cpu_s": {k: float(np.sum(v)) for k, v in cpu.items()},
            "wall_s_median": {k: float(np.median(v)) for k, v in wall.items()},
            "engine_decode_step_s": float(np.median(itl)) if itl else None,
            "engine_one_token_request_s": float(np.median([engine_e2e[i] for i in client_one if i in engine_e2e]))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=128, help="output tokens of the detokenise and SSE runs")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    figures = {**tokenizer_costs(args.repeats, args.tokens), **server_costs(args.repeats, args.tokens)}
    preset = {"per_request_s": figures["http_json_per_request_s"] + figures["tokenise_intercept_s"],
              "per_prompt_token_s": figures["tokenise_per_token_s"],
              "per_output_token_s": figures["detokenise_per_token_s"] + figures["sse_per_streamed_token_s"],
              "in_engine_process": True}
    figures["preset"] = preset
    figures["command"] = "python benchmarks/frontend_cost.py " + " ".join(sys.argv[1:] if argv is None else argv)
    for key, value in figures.items():
        print(f"{key}: {value}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
