"""Run prompts through a servelab stack in a fresh process; print outputs as JSON.

Used by tests that need a clean interpreter (Triton's interpreter must be chosen before triton
is imported). Usage: python run_stack_subprocess.py '{"overrides": [...], "prompts": [...], "max_tokens": [...]}'
"""

import json
import sys

from servelab.api import LLM


def main() -> None:
    spec = json.loads(sys.argv[1])
    overrides = spec["overrides"]
    pins = [p for p in ("model=tiny", "workload=synthetic") if not any(o.startswith(p.split("=")[0] + "=") for o in overrides)]
    lab = LLM(pins + overrides + ["logger=none", "progress=false"])
    for prompt, n in zip(spec["prompts"], spec["max_tokens"]):
        lab.add_request(prompt, n)
    while lab.has_unfinished():
        lab.step()
    result = lab.results()
    print(json.dumps({"outputs": [r["output_token_ids"] for r in result.requests],
                      "leaked_blocks": result.summary["leaked_blocks"]}))


if __name__ == "__main__":
    main()
