"""What machine a GPU check ran on: ``scripts/gpu_check.sh``'s first stage.

    python experiments/gpu_check_env.py OUT/env.json

Writes Python, torch, CUDA, triton and transformers versions, the visible CUDA devices (name, memory,
compute capability, SM count), ``nvidia-smi``'s report (when the command exists) and servelab's
commit (when git can tell), and prints them. Exits 0 whatever the machine has: the other stages
decide what they can run from ``cuda_device_count``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]


def version_of(module: str) -> str | None:
    try:
        return str(__import__(module).__version__)
    except ImportError:
        return None


def command(*argv: str) -> str | None:
    """The command's stdout, or None when it is missing or fails."""
    if shutil.which(argv[0]) is None:
        return None
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=60)
    return done.stdout.strip() if done.returncode == 0 else None


def describe() -> dict:
    import torch

    devices = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            devices.append({"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                            "capability": f"{p.major}.{p.minor}", "multiprocessors": p.multi_processor_count})
    return {
        "python": sys.version.split()[0], "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "torch": torch.__version__, "torch_cuda": torch.version.cuda, "triton": version_of("triton"),
        "transformers": version_of("transformers"), "cuda_available": torch.cuda.is_available(),
        "cuda_device_count": len(devices), "cuda_devices": devices,
        "nvidia_smi": command("nvidia-smi"), "servelab_commit": command("git", "rev-parse", "HEAD"),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the JSON file to write")
    args = ap.parse_args(argv)
    env = describe()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(env, indent=1) + "\n")
    for key, value in env.items():
        if key != "nvidia_smi":
            print(f"{key}: {value}")
    print(env["nvidia_smi"] or "nvidia-smi: not available")
    return 0


if __name__ == "__main__":
    sys.exit(main())
