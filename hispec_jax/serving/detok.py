"""Incremental detokenization: text deltas that never have to be taken back.

Tokens do not map to text one by one: a multi-byte character (an emoji, CJK) is split over
several byte-level tokens, and a tokenizer's decode may join or clean up across token
boundaries (SentencePiece's leading space, `clean_up_tokenization_spaces` turning " ." into
"."). So every push decodes all of the request's new tokens (as `generate` decodes them)
and hands out only the part of the text that later tokens cannot change:

    decoded      "Hi th\ufffd"      -> stable "Hi"   (an incomplete character and a
                                                     trailing space are held back)
    next token   "Hi there."       -> delta " there."

`finish` flushes the rest, so the deltas always join to `tokenizer.decode(ids,
skip_special_tokens=True)`, the text offline `generate` returns.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"  # what a decoder writes for bytes of an unfinished UTF-8 character


class TextDeltas:
    """Turns a growing list of token ids into text deltas.

    Args:
      tokenizer: a Hugging Face tokenizer (`decode(ids, skip_special_tokens=True)`).
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.text = ""  # handed out so far

    def _decoded(self) -> str:
        return self.tokenizer.decode(self.token_ids, skip_special_tokens=True)

    def push(self, token_ids) -> str:
        """Adds tokens; returns the new stable text (possibly "")."""
        self.token_ids.extend(int(t) for t in token_ids)
        stable = self._decoded().rstrip(REPLACEMENT).rstrip()
        if not stable.startswith(self.text):  # a cleanup rewrote held-back text: wait
            return ""
        delta = stable[len(self.text):]
        self.text = stable
        return delta

    def finish(self) -> str:
        """The rest of the text (the request is over)."""
        full = self._decoded()
        if not full.startswith(self.text):  # cannot happen with the stable rule above
            raise RuntimeError(f"streamed text {self.text!r} is not a prefix of {full!r}")
        delta = full[len(self.text):]
        self.text = full
        return delta
