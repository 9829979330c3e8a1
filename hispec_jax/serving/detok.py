"""Incremental detokenization: text deltas that never have to be taken back, at a cost per
step that does not grow with the answer.

Tokens do not map to text one by one: a multi-byte character (an emoji, CJK) is split over
several byte-level or byte-fallback tokens, a SentencePiece decoder strips the space of
the text's first token, and `clean_up_tokenization_spaces` turns " ." into ".". So a step
decodes a short window of tokens, starting where the text last ended cleanly, and hands out
only the part that later tokens cannot change (the prefix-offset / read-offset technique of
vLLM's and TGI's `detokenize_incrementally`):

    token_ids   ... | t5 t6 | t7 t8 t9
                      ^start  ^read    (start: the window's first token; every token
                                        before read is handed out in full)
    prefix      decode(t5 t6)          "Hi"
    window      decode(t5 ... t9)      "Hi th\ufffd"
    delta       window[len(prefix):], less what is held back: " th"

Held back until a later token settles it: a trailing incomplete character (U+FFFD) and,
for a tokenizer that cleans up spaces, a trailing space. Both decodes start at the same
token, so decoder effects at the window's start (the stripped first space) cancel out.
Once a window's text is settled to its last token, the window slides: the tokens of this
step become the next prefix. A window thus spans the previous step's tokens and the new
ones, plus any tokens whose text is still held back; the cost of a step is the size of the
step, and the whole answer costs time linear in its length.

The deltas join to `tokenizer.decode(ids, skip_special_tokens=True)`, the text offline
`generate` returns, for every sequence a tokenizer's own encoder produces. A decoder that
rewrites text already handed out (a run of byte-fallback tokens that turns invalid, a
space cleanup such as " n't" -> "n't") is waited out while the rewrite may still undo
itself; once settled it is not taken back, and the stream goes on by length.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"  # what a decoder writes for bytes of an unfinished UTF-8 character


class TextDeltas:
    """Turns a growing list of token ids into text deltas.

    Args:
      tokenizer: a Hugging Face tokenizer (`decode(ids, skip_special_tokens=True)`;
        `clean_up_tokenization_spaces` is read when present).

    Attributes:
      token_ids: every token pushed so far.
      text: the text handed out so far.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self._pieces: list[str] = []
        self._hold_space = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
        self._start = 0  # the window's first token
        self._read = 0  # tokens before this one are handed out in full
        self._prefix = ""  # decode(token_ids[_start:_read])
        self._sent = ""  # window text after the prefix handed out already (held-back case)

    @property
    def text(self) -> str:
        return "".join(self._pieces)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, token_ids) -> str:
        """Adds tokens; returns the new settled text (possibly "")."""
        self.token_ids.extend(int(t) for t in token_ids)
        return self._step(final=False)

    def finish(self) -> str:
        """The rest of the text (the request is over)."""
        return self._step(final=True)

    def _step(self, final: bool) -> str:
        window = self._decode(self.token_ids[self._start:])
        seen = self._prefix + self._sent
        stable = window
        if not final:
            stable = stable.rstrip(REPLACEMENT)
            if self._hold_space:
                stable = stable.rstrip(" ")
        settled = len(stable) == len(window)
        if not window.startswith(seen) and not settled:
            return ""  # the decoder rewrote handed-out text; later tokens may undo it
        delta = stable[len(seen):]
        if settled:  # everything up to the last token is out: the window slides
            self._start, self._read = self._read, len(self.token_ids)
            self._prefix = self._decode(self.token_ids[self._start:self._read])
            self._sent = ""
        elif delta:
            self._sent += delta
        if delta:
            self._pieces.append(delta)
        return delta
