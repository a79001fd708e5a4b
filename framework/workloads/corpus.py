"""The text corpus every machine has offline: the Python standard library's own sources.

Used by the training script of the shipped models (``experiments/train_tiny``), by
``workload=corpus`` (prompts from the held-out split) and by ``servelab eval-ppl``.

- Files: every ``*.py`` under the running interpreter's stdlib folder, in sorted order of their
  relative path, without ``site-packages`` and without test folders (``test``, ``tests``,
  ``idle_test``: repetitive fixtures rather than library code).
- Held-out split, by file: a file is held out when a hash of (seed, its relative path) falls in
  the first ``fraction`` of the hash range. It depends only on the path, so the split is the same
  on every Python version that has the file, and training never sees a held-out file.
- Documents: each file is cut at its top-level ``def`` / ``class`` / decorator lines (comments
  just above go with the definition), so a document is the module header or one top-level
  definition. Training streams are ``<bos> document <eos>`` back to back: a trained model ends a
  function with EOS by itself.
"""

from __future__ import annotations

import hashlib
import re
import sysconfig
from pathlib import Path

HELDOUT_FRACTION = 0.03
SPLIT_SEED = 0
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"})

_TOP_LEVEL = re.compile(r"(def |class |async def |@)")


class CorpusError(ValueError):
    """An empty or unreadable corpus."""


def stdlib_root() -> Path:
    """The running interpreter's standard-library folder."""
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(root: str | Path | None = None) -> list[Path]:
    """Every ``*.py`` under ``root`` (default: the stdlib), sorted by relative path, test folders excluded."""
    root = Path(root) if root is not None else stdlib_root()
    if not root.is_dir():
        raise CorpusError(f"corpus root {str(root)!r} is not a directory")
    files = [p for p in root.rglob("*.py")
             if p.is_file() and not EXCLUDED_DIRS.intersection(p.relative_to(root).parts[:-1])]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def is_heldout(relative_path: str, fraction: float = HELDOUT_FRACTION, seed: int = SPLIT_SEED) -> bool:
    digest = hashlib.sha256(f"{seed}:{relative_path}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


def split_files(root: str | Path | None = None, fraction: float = HELDOUT_FRACTION,
                seed: int = SPLIT_SEED) -> tuple[list[Path], list[Path]]:
    """(train files, held-out files), each in sorted order."""
    root = Path(root) if root is not None else stdlib_root()
    train: list[Path] = []
    heldout: list[Path] = []
    for path in corpus_files(root):
        (heldout if is_heldout(path.relative_to(root).as_posix(), fraction, seed) else train).append(path)
    return train, heldout


def split_documents(text: str) -> list[str]:
    """Cut one source file into documents at top-level definitions; each ends with one newline."""
    docs: list[list[str]] = []
    current: list[str] = []
    previous = ""  # the last non-blank line
    for line in text.splitlines(keepends=True):
        if _TOP_LEVEL.match(line) and not previous.startswith("@") and any(x.strip() for x in current):
            tail = len(current)  # comment lines right above the definition belong to it
            while tail and (current[tail - 1].startswith("#") or not current[tail - 1].strip()):
                tail -= 1
            while tail < len(current) and not current[tail].strip():
                tail += 1
            docs.append(current[:tail])
            current = current[tail:]
        current.append(line)
        if line.strip():
            previous = line
    docs.append(current)
    out = []
    for lines in docs:
        doc = "".join(lines).strip("\n").rstrip()
        if doc.strip():
            out.append(doc + "\n")
    return out


def read_documents(files: list[Path]) -> list[str]:
    """The documents of ``files`` in order (UTF-8; undecodable bytes replaced)."""
    docs: list[str] = []
    for path in files:
        docs.extend(split_documents(path.read_bytes().decode("utf-8", errors="replace")))
    return docs


def heldout_documents(root: str | Path | None = None, fraction: float = HELDOUT_FRACTION,
                      seed: int = SPLIT_SEED) -> list[str]:
    """The documents of the held-out split (what ``workload=corpus`` and ``eval-ppl`` use)."""
    _, heldout = split_files(root, fraction, seed)
    if not heldout:
        raise CorpusError(f"the held-out split of {str(root or stdlib_root())!r} has no files")
    return read_documents(heldout)


def token_stream(docs: list[str], encode, bos: int | None, eos: int | None) -> list[int]:
    """``<bos> doc <eos>`` for each document, back to back (a missing special is left out).

    ``encode(text)`` returns the token ids of the text without special tokens."""
    stream: list[int] = []
    for doc in docs:
        if bos is not None:
            stream.append(bos)
        stream.extend(encode(doc))
        if eos is not None:
            stream.append(eos)
    return stream


def eval_windows(num_tokens: int, window: int) -> list[tuple[int, int]]:
    """``(start, end)`` windows of at most ``window`` tokens over a stream of ``num_tokens``.

    Consecutive windows overlap by one token, so every token after the first is predicted exactly
    once, by the window whose first token it is not: window ``k`` scores tokens ``start+1 .. end-1``.
    """
    if window < 2:
        raise ValueError(f"window={window} must be >= 2")
    spans, start = [], 0
    while start < num_tokens - 1:
        end = min(start + window, num_tokens)
        spans.append((start, end))
        start = end - 1
    return spans


def checksum(files: list[Path], root: Path) -> str:
    """A short hash of the files' relative paths and contents (which corpus a model saw)."""
    h = hashlib.sha256()
    for path in files:
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]
