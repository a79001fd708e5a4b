"""Chat messages -> prompt token ids, through the checkpoint's chat template.

A checkpoint whose tokenizer has no ``chat_template`` (the shipped ``tiny_code`` models: trained on
plain code) gets :data:`DEFAULT_CHAT_TEMPLATE`, a minimal role-tagged layout::

    <|system|>
    You are terse.
    <|user|>
    hi
    <|assistant|>

It is a convention, not something the tiny models were trained on: their replies are code-like
text. A real chat checkpoint's own template always wins.
"""

from __future__ import annotations

DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def chat_prompt_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of ``messages`` (``[{"role", "content"}]``) rendered by the tokenizer's chat template,
    else :data:`DEFAULT_CHAT_TEMPLATE`; the tokenizer's special tokens (a leading BOS) are added as
    for a text prompt unless the template wrote them itself."""
    template = None if getattr(tokenizer, "chat_template", None) else DEFAULT_CHAT_TEMPLATE
    text = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)
    bos = getattr(tokenizer, "bos_token", None)
    add_special = not (bos and text.startswith(bos))
    return list(tokenizer(text, add_special_tokens=add_special)["input_ids"])
