"""A record as a document: its token ids and, per token, whether the loss is taken on it. Text
records train on every token; chat and instruction records on the assistant's tokens only (the
prompt is masked), rendered by a simple template or the tokenizer's ``chat_template``. Every
document ends with the end-of-text token, trained on (the model learns to stop)."""

from __future__ import annotations

import hashlib
from typing import Any

from cairn.errors import ConfigError
from cairn.trainers.pytorch.records.options import DataFiles

__all__ = ["Document", "Encoder"]

Document = tuple[list[int], list[bool]]
"""Token ids and, for each, whether it is a target of the loss."""


class Encoder:
    """A ``tokenizers.Tokenizer`` or a ``transformers`` fast tokenizer, as the stream uses it;
    ``field``: the options' path in the run's config (``trainer.options.data``)."""

    def __init__(self, tokenizer: Any, options: DataFiles, field: str) -> None:
        self.backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        if not callable(getattr(self.backend, "encode", None)) or not callable(getattr(self.backend, "to_str", None)):
            raise ConfigError(
                "tokenizer", expected="a tokenizers.Tokenizer or a fast transformers tokenizer", found=type(tokenizer)
            )
        self.options = options
        eos = getattr(tokenizer, "eos_token_id", None)
        if eos is None:
            eos = self.backend.token_to_id(options.eos_token)
        if eos is None:
            raise ConfigError(f"{field}.eos_token", expected="a token of the tokenizer", found=options.eos_token)
        self.eos = int(eos)
        template = getattr(tokenizer, "chat_template", None)
        self.chat = tokenizer if template and callable(getattr(tokenizer, "apply_chat_template", None)) else None
        if options.template == "chat_template" and self.chat is None:
            raise ConfigError(f"{field}.template", expected="a tokenizer with a chat_template", found="none")
        if options.template == "simple":
            self.chat = None
        self.identity = hashlib.sha256(
            f"{self.backend.to_str()}\0{template if self.chat is not None else ''}\0{self.eos}".encode()
        ).hexdigest()
        """The tokenizer's vocabulary, rules and template, hashed: part of the data's fingerprint."""

    def encode(self, text: str) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def document(self, record: Any, where: str) -> Document:
        o = self.options
        if o.records == "text":
            text = record if isinstance(record, str) else _field(record, o.text_field, str, where)
            tokens = self.encode(text)
            return [*tokens, self.eos], [True] * (len(tokens) + 1)
        if o.records == "instruction":
            messages = [
                {"role": "user", "content": _field(record, o.prompt_field, str, where)},
                {"role": "assistant", "content": _field(record, o.response_field, str, where)},
            ]
        else:
            messages = _messages(_field(record, o.messages_field, list, where), where)
        segments = self._rendered(messages, where) if self.chat is not None else _simple(messages)
        ids: list[int] = []
        flags: list[bool] = []
        for text, trained in segments:
            part = self.encode(text)
            ids += part
            flags += [trained] * len(part)
        return [*ids, self.eos], [*flags, True]

    def _rendered(self, messages: list[dict[str, str]], where: str) -> list[tuple[str, bool]]:
        """The chat template's text cut at each message: an assistant's reply (after its header,
        which the generation prompt renders) is trained on; everything else is prompt."""
        assert self.chat is not None
        out: list[tuple[str, bool]] = []
        done = ""
        for i, message in enumerate(messages):
            if message["role"] == "assistant":
                head = self._render(messages[:i], where, prompt=True)
                out.append((_after(done, head, where), False))
                done = head
            text = self._render(messages[: i + 1], where, prompt=False)
            out.append((_after(done, text, where), message["role"] == "assistant"))
            done = text
        return out

    def _render(self, messages: list[dict[str, str]], where: str, *, prompt: bool) -> str:
        if not messages:
            return ""
        assert self.chat is not None
        try:
            text = self.chat.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
        except Exception as exc:  # the template's own refusal (jinja2's TemplateError, ...)
            raise ConfigError(where, expected="messages the chat_template renders", found=str(exc)[:200]) from None
        return str(text)


def _after(done: str, text: str, where: str) -> str:
    if not text.startswith(done):
        raise ConfigError(
            where, expected="a chat_template whose rendering of a conversation extends its prefix", found="not so"
        )
    return text[len(done) :]


def _simple(messages: list[dict[str, str]]) -> list[tuple[str, bool]]:
    """``<|role|>\\n`` (prompt), then the content and a newline (trained on for the assistant)."""
    out: list[tuple[str, bool]] = []
    for m in messages:
        out.append((f"<|{m['role']}|>\n", False))
        out.append((m["content"] + "\n", m["role"] == "assistant"))
    return out


def _field(record: Any, name: str, kind: type, where: str) -> Any:
    value = record.get(name) if isinstance(record, dict) else None
    if not isinstance(value, kind):
        found = "no such field" if not isinstance(record, dict) or name not in record else type(value).__name__
        raise ConfigError(f"{where}: field {name!r}", expected=f"a {kind.__name__}", found=found)
    return value


def _messages(value: list[Any], where: str) -> list[dict[str, str]]:
    out = []
    for i, m in enumerate(value):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise ConfigError(f"{where}: message {i}", expected="{role, content} strings", found=str(m)[:80])
        out.append({"role": m["role"], "content": m["content"]})
    if not any(m["role"] == "assistant" for m in out):
        raise ConfigError(f"{where}: messages", expected="at least one assistant message", found="none")
    return out
