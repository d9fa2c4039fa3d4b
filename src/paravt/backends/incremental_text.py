"""Streaming text out of a growing list of token ids (`paravt serve`'s stream=true)."""

from __future__ import annotations


class IncrementalText:
    """Decodes a growing list of token ids into text pieces, one `push` at a time, without
    re-decoding the whole list each step: only the last few ids are decoded again (a byte-level
    token may complete a character that earlier tokens began), and a piece that ends in U+FFFD (half
    a UTF-8 character) waits for the next token. vLLM's detokenizer works the same way."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.start = 0  # decoding context begins here
        self.read = 0  # text up to here has been handed out

    def push(self, token: int) -> str:
        self.ids.append(token)
        done = self.tok.decode(self.ids[self.start:self.read], skip_special_tokens=False)
        now = self.tok.decode(self.ids[self.start:], skip_special_tokens=False)
        if len(now) <= len(done) or now.endswith("\ufffd"):
            return ""
        self.start, self.read = self.read, len(self.ids)
        return now[len(done):]
