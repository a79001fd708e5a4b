"""The model card (``MODEL_CARD.md``) of a trained length predictor, from its ``meta.json``."""

from __future__ import annotations


def _tau(value: float | None) -> str:
    return "undefined (all ties)" if value is None else f"{value:.3f}"


def _num(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _row(name: str, heldout: dict, cv: dict) -> str:
    return (f"| {name} | {_tau(heldout['kendall_tau_b'])} | {_num(heldout['bucket_accuracy'])} | "
            f"{_num(heldout['stop_auc'])} | {_num(heldout['mae_tokens'], 1)} | {_tau(cv['kendall_tau_b'])} | "
            f"{_num(cv['stop_auc'])} |")


def model_card(meta: dict) -> str:
    d, t, b, base = meta["data"], meta["training"], meta["buckets"], meta["baselines"]
    f = meta["features"]
    edges = b["edges"]
    ranges = [f"[{lo}, {hi})" for lo, hi in zip(edges, edges[1:])] + [f">= {edges[-1]}"]
    return f"""# length_predictor=learned for `{meta['model']['name']}`

Predicts how many tokens the shipped `{meta['model']['name']}` model generates for a prompt,
before it runs, for length-aware schedulers (`scheduler=sjf length_predictor=learned model=tiny_code`).
Made by `{meta['command'].strip()}`.

## Held-out results

{d['num_heldout']} distinct prompts of the corpus's held-out split (the prompts `workload=corpus`
draws; those that also occur in the training split left out), greedy, `max_tokens={d['max_tokens']}`;
{d['heldout_stopped']} of them stop at EOS before `max_tokens`.

| predictor | held-out tau-b | held-out bucket accuracy | held-out AUC "stops early" | held-out MAE | CV tau-b | CV AUC |
|---|---|---|---|---|---|---|
{_row("learned (this)", meta["heldout_metrics"], meta["cv_metrics"])}
{_row("baseline: same classifier, prompt length only", **base["prompt_length"])}
{_row("baseline: same classifier, last prompt token only", **base["last_token"])}
{_row("baseline: constant (training mean; majority bucket)", **base["constant"])}

- Kendall's tau-b orders predictions against the true lengths (what a shortest-first scheduler
  needs). Ties in the truth bound it: with most prompts at `max_tokens`, a perfect ranking that
  breaks those ties scores {d['heldout_tau_b_ceiling']:.3f} here, not 1. AUC "stops early" is the chance that a
  prompt that stops at EOS is predicted shorter than one that runs to `max_tokens` (0.5 = chance).
- CV (cross-validated): out-of-fold predictions for the {d['num_train']} training prompts ({t['folds']} folds, each
  model fitted without its fold), {d['train_stopped']} of which stop early: steadier figures than the held-out
  split's {d['heldout_stopped']}.
- Where the two disagree, they rest on few prompts that stop early: compare predictors by the
  CV columns. MAE is in tokens.
- Bucket accuracy: the most probable bucket is the true one. The constant baseline's majority
  bucket ("ran to the cap") is right for most prompts, so accuracy barely separates predictors
  here; the ranking figures do.

## Data

- Corpus: {d['corpus']} (Python {d['python']}).
- Prompts: the first {d['prefix_bytes']} bytes of a document (a module header or one top-level
  definition), as `workload=corpus` makes them; {d['num_train']} distinct training prompts drawn
  with seed {t['seed']}.
- Targets: `{meta['model']['name']}`'s own {d['decoding']} generations on servelab's engine (CPU),
  stopping at EOS or `max_tokens={d['max_tokens']}`: {d['train_stopped']} of {d['num_train']} training
  prompts stop at EOS (generation took {d['generation_wall_s']:.0f} s).
- Training bucket counts: {', '.join(f'{r}: {c}' for r, c in zip(ranges, d['train_bucket_counts']))}.

## Model

- Features (`servelab.plugins.length_predictors.features`): the token-id histogram of the whole
  prompt ({f['vocab_size']} bins), of its last {f['tail']} tokens, hashed bigrams of those last
  tokens ({f['hash_bins']} bins), log prompt length, a bias.
- {t['model']}, over {len(ranges)} log-spaced buckets {', '.join(ranges)};
  L2 = {t['l2']:g}, chosen by {t['folds']}-fold cross-validated log loss on the training split.
- Prediction: {meta['prediction']}; the top bucket ("did not stop within {d['max_tokens']} tokens")
  is predicted at the request's own cap. Bucket means: {', '.join(f'{m:.1f}' for m in b['means'])}.
- Trained for `{meta['model']['name']}` with fingerprint `{meta['model']['fingerprint']}`
  ({meta['model']['fingerprint_of']}); any other model is refused at start-up.

## Limits

- The greedy tiny model rarely ends a document by itself: it mostly loops until `max_tokens`.
  The predictor is in effect a detector of the prompts it completes quickly (a short statement
  left open, a one-line body), which is all the ranking there is to learn.
- Trained on greedy decoding at `max_tokens={d['max_tokens']}`. With sampling (`temperature > 0`)
  the model stops elsewhere (one warning says so). A longer `max_tokens` is extrapolated: the
  "did not stop" bucket is predicted to run to the request's cap.
- Only for this checkpoint: the features are its byte-level token ids. For other models, or in
  the simulator with a catalogue model, use `length_predictor=oracle` or `noisy_oracle`.
- Few positives: the held-out figures rest on {d['heldout_stopped']} prompts that stop early, so they
  are noisy.
"""
