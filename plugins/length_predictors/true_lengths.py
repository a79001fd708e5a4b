"""The true output length of a request, for the oracle predictors.

- ``ignore_eos`` (synthetic, trace and hash-id workloads; a token-id prompt): the engine stops
  a request at ``max_tokens`` or when it reaches ``max_model_len``, so the truth is
  ``min(max_tokens, max_model_len - prompt_len)``. No file needed.
- otherwise it depends on where the model stops (EOS), which only a run can tell: the truth is
  read from the ``requests.jsonl`` of an earlier run of the same workload (``lengths_from``),
  by request id. Only finished records count (``finish_reason`` ``stop`` or ``length``); a
  record cut at its own, smaller ``max_tokens`` does not say where this request stops, and is
  an error when asked about.

The simulator (``backend=sim``) has no EOS: it always generates ``max_tokens`` (capped by
``max_model_len``). Its workloads ignore EOS, so they need no file either; a text workload in
the simulator does, from an earlier simulator run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from servelab.plugin_api import Request


@dataclass(frozen=True)
class Recorded:
    output_len: int
    finish_reason: str  # "stop" (EOS, a stop string) or "length" (max_tokens, max_model_len)
    prompt_len: int


class TrueLengths:
    """``truth(request)``: the number of tokens ``request`` generates (see the module docstring)."""

    def __init__(self, lengths_from: str | None, max_model_len: int) -> None:
        self.max_model_len = max_model_len
        self.source = lengths_from
        self.recorded = {} if lengths_from is None else read_lengths(lengths_from)

    def truth(self, request: Request) -> int:
        room = max(0, min(request.max_tokens, self.max_model_len - request.prompt_len))
        if request.ignore_eos:
            return room
        if self.source is None:
            raise LookupError(f"request {request.id!r} stops at EOS (ignore_eos=false), so its length is only known "
                              "from an earlier run: set length_predictor.lengths_from=<that run's requests.jsonl>")
        rec = self.recorded.get(request.id)
        if rec is None:
            raise LookupError(f"length_predictor.lengths_from={self.source!r} has no finished request "
                              f"{request.id!r}: it must come from a run of the same workload")
        hit_context = rec.prompt_len + rec.output_len >= self.max_model_len  # as it would here
        if rec.finish_reason == "stop" or rec.output_len >= room or hit_context:
            return min(rec.output_len, room)
        raise LookupError(f"length_predictor.lengths_from={self.source!r}: request {request.id!r} was cut at "
                          f"{rec.output_len} tokens there (its max_tokens), this run allows {room}: "
                          "rerun the earlier run with at least this max_tokens")


def read_lengths(lengths_from: str) -> dict[str, Recorded]:
    """Request id -> its recorded length, from a ``requests.jsonl`` (or the run folder holding one).
    A missing or unreadable file, or one without a finished request, is a one-line ValueError."""
    key = f"length_predictor.lengths_from={lengths_from!r}"
    path = Path(lengths_from).expanduser()
    if path.is_dir():
        path = path / "requests.jsonl"
    if not path.is_file():
        raise ValueError(f"{key}: no such file (give the requests.jsonl of an earlier run of this workload)")
    out: dict[str, Recorded] = {}
    try:
        with path.open() as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                rec = json.loads(line)
                if rec.get("finish_reason") in ("stop", "length"):
                    out[str(rec["id"])] = Recorded(int(rec["output_len"]), rec["finish_reason"],
                                                   int(rec["prompt_len"]))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{key}: cannot read {path} ({type(exc).__name__}: {exc})") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{key}: {path}:{lineno} is not a requests.jsonl record "
                         f"(needs id, prompt_len, output_len, finish_reason; {type(exc).__name__}: {exc})") from None
    if not out:
        raise ValueError(f"{key}: {path} records no finished request")
    return out
