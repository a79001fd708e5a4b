#!/usr/bin/env bash
# Re-measure the step-time profiles the experiment presets run on (clock=virtual time_model=profile).
# Run on a quiet machine from the repo root, one thread (as the experiments): each takes ~3 minutes (3 probe rounds).
set -euo pipefail
cd "$(dirname "$0")/../.."
SMALL="model=tiny model.hidden_size=64 model.num_hidden_layers=2 model.num_attention_heads=4 model.num_key_value_heads=2"
servelab profile --out=experiments/profiles/small64.json backend.num_threads=1 $SMALL model.intermediate_size=128 max_model_len=1024
servelab profile --out=experiments/profiles/cvs64.json backend.num_threads=1 $SMALL model.intermediate_size=172
servelab profile --out=experiments/profiles/tiny256.json backend.num_threads=1 model=tiny
