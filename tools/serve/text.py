"""Generated token ids -> the text a client sees, a step at a time, with stop strings.

Incremental decoding: a byte-level token may end inside a UTF-8 character, so the text of the
last few tokens is decoded again with a little context (the tokens since the last emitted
character boundary) and a delta is released only when it does not end in U+FFFD (an incomplete
character); `finish` releases what is left. Each step decodes a handful of tokens, not the whole
answer.

Stop strings: the answer ends before the first occurrence of any stop string (OpenAI's rule: the
stop string itself is not returned). Text that could still become the start of a stop string is
held back until the next token decides it.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class TextStream:
    def __init__(self, tokenizer, stop_strings=()):
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # ids[prefix:read] were decoded last time as context
        self._read = 0  # ids before this index are in `text`
        self.text = ""  # decoded so far (not all of it released)
        self._released = 0  # characters of `text` handed out
        self._stops = [s for s in stop_strings if s]
        self._hold = max(map(len, self._stops), default=1) - 1
        self.stopped = False  # a stop string was found: the text ends before it

    def push(self, ids) -> str:
        """Add generated ids; returns the newly releasable text ('' while a character or a possible
        stop string is incomplete, and always '' once stopped)."""
        if self.stopped:
            return ""
        self._ids.extend(int(i) for i in ids)
        context = self._tok.decode(self._ids[self._prefix : self._read])
        full = self._tok.decode(self._ids[self._prefix :])
        if len(full) > len(context) and not full.endswith(REPLACEMENT):
            self.text += full[len(context) :]
            self._prefix, self._read = self._read, len(self._ids)
        return self._release(final=False)

    def finish(self) -> str:
        """The rest of the text at the end of the answer (incomplete characters as U+FFFD)."""
        if not self.stopped and self._read < len(self._ids):
            context = self._tok.decode(self._ids[self._prefix : self._read])
            self.text += self._tok.decode(self._ids[self._prefix :])[len(context) :]
            self._read = len(self._ids)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        if self._stops and not self.stopped:
            # a stop string may begin up to len(stop) - 1 characters before the unreleased text
            start = max(self._released - self._hold, 0)
            hits = [i for i in (self.text.find(s, start) for s in self._stops) if i >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self.stopped = True
                final = True
        end = len(self.text)
        if not final and self._stops:
            end = max(self._released, end - self._partial_stop())
        out = self.text[self._released : end]
        self._released = end
        return out

    def _partial_stop(self) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        best = 0
        for s in self._stops:
            for n in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:n]):
                    best = n
                    break
        return best
