"""Turns generated token bytes into text deltas that never split a UTF-8 character or leak a stop string.

A byte-level BPE token can hold part of a character (an emoji is 4 bytes, often 2-4 tokens), so the
stream accumulates bytes and emits only complete characters. Stop strings are matched on text; to
avoid sending the start of a stop string that later completes, a tail that is a prefix of a stop
string (at most `len(longest stop) - 1` characters) is held back until it is known not to begin one.
"""

from __future__ import annotations

import codecs


class TextStream:
    """Incremental detokenizer for one request: `feed(bytes)` returns text that is safe to send."""

    def __init__(self, stop: list[str] | None = None) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = [s for s in (stop or []) if s]
        self._holdback = max((len(s) for s in self._stops), default=1) - 1
        self._pending = ""
        self.text = ""          # everything emitted so far
        self.stopped = False    # a stop string was found; nothing more will be emitted

    def feed(self, data: bytes) -> str:
        """Add the bytes of new tokens; return the newly emittable text (possibly '')."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(data)
        return self._release(final=False)

    def finish(self) -> str:
        """End of generation: flush incomplete bytes (as U+FFFD) and everything held back."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(b"", final=True)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        # A stop string always starts inside the pending text: everything emitted earlier was checked
        # with at least len(stop) - 1 characters after it.
        cut = -1
        for s in self._stops:
            i = self._pending.find(s)
            if i != -1 and (cut == -1 or i < cut):
                cut = i
        if cut != -1:
            out, self._pending, self.stopped = self._pending[:cut], "", True
        elif final or self._holdback == 0:
            out, self._pending = self._pending, ""
        else:
            keep = self._partial_stop_len()
            split = len(self._pending) - keep
            out, self._pending = self._pending[:split], self._pending[split:]
        self.text += out
        return out

    def _partial_stop_len(self) -> int:
        """Length of the longest tail of the pending text that could still grow into a stop string."""
        for k in range(min(self._holdback, len(self._pending)), 0, -1):
            tail = self._pending[-k:]
            if any(s.startswith(tail) for s in self._stops):
                return k
        return 0
