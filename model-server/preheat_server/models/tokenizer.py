"""The tokenizer the engine and the HTTP layer share: ``tokenizer.json`` through the `tokenizers` library.

Adds what serving needs beyond encode/decode: raw-byte decoding (so a stream never splits a UTF-8
character) and a simple chat template.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

CHAT_START, CHAT_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map that byte-level BPE vocabularies are written in."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


_UNICODE_TO_BYTE = {c: b for b, c in _bytes_to_unicode().items()}


class Tokenizer:
    """Wraps a `tokenizers.Tokenizer`; every method the server uses is here.

    Chat template (documented in docs/engine.md): each message becomes
    ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` and the prompt ends with ``<|im_start|>assistant\\n``
    (ChatML). Models whose vocabulary lacks those markers get the same text; it is just text then.
    """

    def __init__(self, tok: HFTokenizer, eos_token_id: int, stop_token_ids: tuple[int, ...] = (),
                 chat_template: str | None = None, special_tokens: dict[str, str] | None = None):
        self._tok = tok
        self.chat_template = chat_template
        self._template: Any = None  # compiled on first use
        self.special_tokens = dict(special_tokens or {})  # bos_token / eos_token text for templates
        self.eos_token_id = eos_token_id
        # Token ids that end a turn besides EOS (e.g. <|im_end|> for chat).
        self.stop_token_ids = tuple(sorted({eos_token_id, *stop_token_ids}))
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self._special_ids = {i for i, t in self._added_tokens() if t.special}
        vocab = tok.get_vocab(with_added_tokens=True)
        self._id_to_token = {i: s for s, i in vocab.items()}
        self._byte_level = "ByteLevel" in json.dumps(json.loads(tok.to_str()).get("decoder") or {})
        self._piece_bytes: dict[int, bytes] = {}

    def _added_tokens(self) -> list[tuple[int, Any]]:
        try:
            return list(self._tok.get_added_tokens_decoder().items())
        except AttributeError:  # very old tokenizers
            return []

    @classmethod
    def from_folder(cls, folder: Path, eos_token_id: int | None, extra_eos: tuple[int, ...] = ()) -> Tokenizer:
        path = Path(folder) / "tokenizer.json"
        if not path.is_file():
            raise ValueError(f"{folder} has no tokenizer.json")
        tok = HFTokenizer.from_file(str(path))
        cfg_path = Path(folder) / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        specials = {}
        for key in ("bos_token", "eos_token"):
            value = cfg.get(key)
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                specials[key] = value
        eos = specials.get("eos_token")
        if eos_token_id is None and eos is not None and tok.token_to_id(eos) is not None:
            eos_token_id = tok.token_to_id(eos)
        template = cfg.get("chat_template")
        if isinstance(template, list):  # several named templates: the default one
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        if eos_token_id is None:
            eos_token_id = tok.token_to_id(END_OF_TEXT) or 0
        im_end = tok.token_to_id(CHAT_END)
        stops = tuple(extra_eos) + ((im_end,) if im_end is not None else ())
        return cls(tok, int(eos_token_id), stops, template if isinstance(template, str) else None, specials)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for (empty for special tokens)."""
        b = self._piece_bytes.get(token_id)
        if b is None:
            piece = self._id_to_token.get(token_id, "")
            if token_id in self._special_ids:
                b = b""
            elif self._byte_level:
                b = bytes(_UNICODE_TO_BYTE[c] for c in piece if c in _UNICODE_TO_BYTE)
            elif m := _BYTE_FALLBACK.match(piece):
                b = bytes([int(m.group(1), 16)])
            else:  # SentencePiece-style: "▁" marks a space
                b = piece.replace("▁", " ").encode("utf-8")
            self._piece_bytes[token_id] = b
        return b

    def decode_bytes(self, ids: list[int]) -> bytes:
        """Raw UTF-8 bytes of ``ids``; a stream may end mid-character, the caller buffers the tail."""
        return b"".join(self.token_bytes(int(i)) for i in ids)

    def apply_chat_template(self, messages: list[dict]) -> str:
        """The model's own Jinja chat template when it has one (as transformers renders it), else ChatML."""
        if self.chat_template:
            return self._render(messages)
        parts = []
        for m in messages:
            role = str(m.get("role", "user"))
            content = m.get("content", "")
            if isinstance(content, list):  # OpenAI content parts: keep the text ones
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            parts.append(f"{CHAT_START}{role}\n{content}{CHAT_END}\n")
        parts.append(f"{CHAT_START}assistant\n")
        return "".join(parts)

    def _render(self, messages: list[dict]) -> str:
        if self._template is None:
            from jinja2 import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message: str) -> None:
                raise TemplateError(message)

            # transformers' settings: a sandbox (templates come with downloaded files), trim/lstrip blocks.
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = raise_exception
            self._template = env.from_string(self.chat_template)
        from jinja2 import TemplateError

        plain = [{"role": str(m.get("role", "user")), "content": _text(m.get("content", ""))} for m in messages]
        try:
            return self._template.render(messages=plain, add_generation_prompt=True, **self.special_tokens)
        except TemplateError as exc:
            raise ValueError(f"the model's chat template rejected these messages: {exc}") from exc


def _text(content: Any) -> str:
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)
