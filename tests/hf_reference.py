"""HF transformers as the correctness oracle: greedy generate of each prompt alone."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from servelab.exec.model.random_checkpoint import write_random_checkpoint


def hf_greedy(model_dir, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
    """Greedy continuation of each prompt, alone (no padding), ignoring EOS; float32."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    outputs = []
    with torch.inference_mode():
        for prompt, n in zip(prompts, max_tokens):
            ids = torch.tensor([prompt])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, pad_token_id=0, eos_token_id=None)
            outputs.append(out[0, len(prompt):].tolist())
    return outputs


def random_checkpoints_with_greedy(root: Path, archs: dict, base: dict, num_prompts: int):
    """Write a random checkpoint per ``archs`` entry (``name -> (architecture, extra config)``, over
    ``base``) under ``root`` and read HF's greedy tokens for ``num_prompts`` random prompts on each:
    ``({name: (path, hf tokens)}, prompts, max_tokens)``, the same prompts for every checkpoint."""
    rng = random.Random(3)
    prompts = [[rng.randrange(256) for _ in range(rng.randint(2, 70))] for _ in range(num_prompts)]
    max_tokens = [rng.randint(2, 10) for _ in prompts]
    out = {}
    for name, (arch, extra) in archs.items():
        path = write_random_checkpoint(root / name, arch, seed=5, **{**base, **extra})
        out[name] = (path, hf_greedy(path, prompts, max_tokens))
    return out, prompts, max_tokens
