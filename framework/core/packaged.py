"""Where the data shipped inside the package lives: the trained checkpoints
(``experiments/train_tiny`` made them) and the public request traces (``framework/data/traces``,
with their sources and licences in its README). Path constants and name look-ups, no reading of
the files, so any layer may use them."""

from __future__ import annotations

from pathlib import Path

from servelab.core.errors import WorkloadError

_PACKAGE = Path(__file__).resolve().parents[1]
PACKAGED_CHECKPOINTS = _PACKAGE / "checkpoints"
PACKAGED_MODELS = ("tiny_code", "tiny_code_draft")

PACKAGED_TRACES_DIR = _PACKAGE / "data" / "traces"
# name -> the shipped trace file; ``workload.path=<name>`` selects one wherever a trace path is read
PACKAGED_TRACES: dict[str, Path] = {
    "azure_code": PACKAGED_TRACES_DIR / "AzureLLMInferenceTrace_code.csv",  # Azure LLM inference 2023, code
    "azure_conv": PACKAGED_TRACES_DIR / "AzureLLMInferenceTrace_conv.csv",  # Azure LLM inference 2023, conversation
    "mooncake_conv": PACKAGED_TRACES_DIR / "conversation_trace.jsonl",  # Mooncake (FAST'25) conversation, hash_ids
    "sharegpt_lengths": PACKAGED_TRACES_DIR / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv",  # lengths only
}


def trace_path(value: str | Path, key: str = "workload.path") -> Path:
    """The file ``value`` names: a packaged trace's name (``azure_conv``, ...) or a path to an
    existing file. Anything else is a one-line :class:`WorkloadError` naming ``key`` and the names."""
    text = str(value)
    if text in PACKAGED_TRACES:
        return PACKAGED_TRACES[text]
    path = Path(text).expanduser()
    if path.is_file():
        return path
    raise WorkloadError(f"{key}={text!r}: no such file, and not a packaged trace "
                        f"(names: {', '.join(PACKAGED_TRACES)})")
