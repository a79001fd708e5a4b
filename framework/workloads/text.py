"""Text in, text out: the checkpoint's tokenizer (any HF checkpoint that has one) and the
byte-level tokenizer of the shipped models.
"""

from __future__ import annotations

from pathlib import Path

from servelab.core.errors import ServelabError

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
BYTE_VOCAB_SIZE = 259  # bytes 0..255 are their own ids; then BOS 256, EOS 257, PAD 258
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


class TextError(ServelabError, ValueError):
    """Text where the checkpoint cannot tokenize it; the message names the checkpoint."""


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (what the ByteLevel pre-tokenizer emits)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def build_byte_tokenizer():
    """A byte-level HF tokenizer: id = byte value for 0..255, ``<s>`` 256, ``</s>`` 257, ``<pad>`` 258.

    Made with the ``tokenizers`` library (a BPE with no merges over GPT-2's byte alphabet), so
    ``save_pretrained`` writes a ``tokenizer.json`` that ``AutoTokenizer.from_pretrained`` loads.
    Encoding a text prepends ``<s>`` (like Llama's tokenizers); ``add_special_tokens=False`` does not.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors  # noqa: PLC0415 - transformers
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415 - transformers

    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([BOS, EOS, PAD])
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, 256)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   clean_up_tokenization_spaces=False, model_max_length=2**20)


def has_tokenizer(path: str | Path) -> bool:
    return any((Path(path) / name).is_file() for name in _TOKENIZER_FILES)


def load_tokenizer(path: str | Path):
    """The checkpoint's HF tokenizer, or None when the directory has none."""
    if not has_tokenizer(path):
        return None
    from transformers import AutoTokenizer  # noqa: PLC0415 - transformers

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # report any loader failure as bad input
        raise TextError(f"model.path={str(path)!r}: its tokenizer could not be loaded: {exc}") from exc


class CheckpointText:
    """The tokenizer of the configured checkpoint, loaded on first use.

    ``name`` says which checkpoint in messages; ``path`` None = a checkpoint without a tokenizer
    (the random-weight ``model=tiny``).
    """

    def __init__(self, path: str | Path | None, name: str | None = None) -> None:
        self.path = None if path is None else str(path)
        self.name = name or (f"model.path={self.path!r}" if self.path else "model=tiny (random weights)")
        self._tokenizer = None
        self._loaded = False

    @property
    def tokenizer(self):
        if not self._loaded:
            self._tokenizer = load_tokenizer(self.path) if self.path else None
            self._loaded = True
        return self._tokenizer

    @property
    def available(self) -> bool:
        return self.tokenizer is not None

    def require(self, where: str, hint: str = "give 'prompt_token_ids' instead", what: str = "a text prompt"):
        """The tokenizer, or an error naming ``where`` and the checkpoint."""
        if self.tokenizer is None:
            raise TextError(f"{where}: {what} needs a tokenizer, but the checkpoint {self.name} has none; {hint}")
        return self.tokenizer

    def encode(self, text: str, where: str) -> tuple[int, ...]:
        """Token ids of a prompt, with the tokenizer's own special tokens (e.g. a leading BOS). An
        empty text is no prompt: ``()``, which the engine rejects ("empty prompt"), not a BOS alone."""
        tokenizer = self.require(where)
        return tuple(tokenizer(text)["input_ids"]) if text else ()

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens (corpus streams)."""
        return self.require("corpus text")(text, add_special_tokens=False)["input_ids"]

    def decode(self, token_ids) -> str | None:
        """The text of ``token_ids`` (special tokens dropped), or None without a tokenizer."""
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)


def checkpoint_text(cfg) -> CheckpointText:
    """The :class:`CheckpointText` of the configured model (``model.path``; none for ``model=tiny``)."""
    path = cfg.model.get("path")
    return CheckpointText(path, f"model={cfg.model.name} ({path or 'random weights'})")


def text_decorator(text: CheckpointText):
    """``decorate(record, seq)`` adding ``prompt_text`` / ``output_text`` to a request record, or
    None when the checkpoint has no tokenizer (the records then carry token ids only)."""
    if not text.available:
        return None

    def decorate(rec: dict, seq) -> None:
        rec["prompt_text"] = text.decode(seq.request.prompt_token_ids)
        rec["output_text"] = text.decode(rec["output_token_ids"])

    return decorate


def attach_text(records: list[dict], sequences: dict, text: CheckpointText) -> None:
    """Add ``prompt_text`` and ``output_text`` to each record whose sequence is in ``sequences``."""
    decorate = text_decorator(text)
    if decorate is None:
        return
    for rec in records:
        seq = sequences.get(rec["id"])
        if seq is not None:
            decorate(rec, seq)
