"""Decode-step time against batch size, on this CPU (wall clock) and in the simulator.

    python experiments/capacity_search/step_times.py              # writes step_times.json beside this script
    python experiments/capacity_search/step_times.py --sim-only   # keeps the measured CPU part, redoes the sim's

The same probe through the same engine for both: B requests with 72-token prompts (the mean prompt
of the continuous-vs-static workload) are admitted together, and the steps that only decode all B
of them are timed (median). "cpu" is the model of ``experiment=continuous_vs_static`` (the tiny
Llama at hidden size 64, 1 torch thread) on this machine's wall clock (measured, not a profile); "sim" is ``experiment=continuous_vs_static_sim``
(Llama-2-70B, 4 x A100-80GB, tensor parallel 4) on the virtual clock, with its time model's
breakdown of the step at each batch size (``time_model`` records which).
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BATCHES = (1, 2, 4, 8, 16, 32, 64)
PROMPT_LEN = 72


def probe(overrides: list[str], decode_steps: int) -> dict:
    import servelab

    cfg = servelab.compose(overrides + ["max_num_seqs=64", "progress=false"], logger="none")
    rows = {}
    with servelab.LLM(cfg) as lab:
        time_model = lab.stack.time_model if lab.stack.clock_kind == "virtual" else None
        for batch in BATCHES:
            for _ in range(batch):
                lab.add_request(list(range(1, PROMPT_LEN + 1)), max_tokens=decode_steps + 1)
            times, work = [], None
            while lab.has_unfinished():
                rec = lab.step()
                if rec is not None and rec.prefill_tokens == 0 and rec.decode_seqs == batch:
                    times.append(rec.duration_s)
                    work = rec.work
            row = {"median_ms": statistics.median(times) * 1e3, "steps": len(times)}
            if time_model is not None and work is not None:
                row["breakdown_ms"] = {k: v * 1e3 for k, v in time_model.breakdown(work).items()}
            rows[batch] = row
    return rows


def cpu_overrides() -> list[str]:
    """The model and backend of ``experiment=continuous_vs_static``, on the wall clock.

    Read from the preset's YAML rather than selecting it: the preset may price steps on the virtual
    clock with a profile, and here the CPU's own step times are the point."""
    import yaml

    preset = yaml.safe_load((HERE.parent.parent / "conf" / "experiment" / "continuous_vs_static.yaml").read_text())
    return ["clock=wall", "time_model=measured"] + [
        f"{group}.{key}={value}" for group in ("model", "backend") for key, value in (preset.get(group) or {}).items()]


def main() -> None:
    t0 = time.time()
    old = json.loads((HERE / "step_times.json").read_text()) if (HERE / "step_times.json").is_file() else None
    if "--sim-only" in sys.argv[1:] and old is not None:
        cpu, when = old["cpu"], {k: old[k] for k in ("date", "machine")}
    else:
        cpu = probe(cpu_overrides(), decode_steps=48)  # wall clock: more steps, less noise
        when = {"date": time.strftime("%Y-%m-%d %H:%M"),
                "machine": f"{platform.node()}, {platform.processor() or platform.machine()}"}
    import servelab

    sim_overrides = ["experiment=continuous_vs_static_sim", "debug.log_steps=false"]
    sim = probe(sim_overrides, decode_steps=8)
    time_model = servelab.compose(sim_overrides, logger="none")["time_model"]["name"]
    out = {**when, "prompt_len": PROMPT_LEN, "cpu": cpu, "sim": sim, "sim_time_model": time_model,
           "sim_date": time.strftime("%Y-%m-%d %H:%M"), "wall_s": round(time.time() - t0, 1)}
    (HERE / "step_times.json").write_text(json.dumps(out, indent=1) + "\n")
    for name, rows in (("cpu (wall clock)", cpu), (f"sim ({time_model})", sim)):
        print(name, {b: round(r["median_ms"], 2) for b, r in rows.items()})


if __name__ == "__main__":
    sys.exit(main())
