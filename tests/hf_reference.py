"""HF transformers as the correctness oracle: greedy generate of each prompt alone."""

from __future__ import annotations

import torch


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
