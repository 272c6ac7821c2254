"""Chat messages and documents rendered into a prompt, with where each of them landed: :func:`render_chat` (and
:func:`render_prompt` for a plain prompt with documents).

A chat model reads its messages through its chat template: a Jinja program that writes role headers, turn markers
and sometimes default text around each message's content. To say which message (or document) a prompt token came
from, the prompt is rendered with the template (transformers' ``apply_chat_template``, untokenized), each message's
content and each document's title and text is located in the rendered string, and the string is tokenized with the
fast tokenizer's character offsets (the same call ``apply_chat_template(tokenize=True)`` makes, so the ids are the
model's own). A token is in a message or document when its first non-space character is inside that content's
span (:mod:`explainers.units`); every other token is a *template* token: role headers, turn markers, a default
system prompt, the documents' numbering.

**Locating a content** in the rendered string. The template is rendered a second time with each content replaced by
a unique marker, which says in what order the template writes the contents (and which it leaves out). The contents
are then searched in that order, each after the previous one's end: first exactly, then without the white space at
its ends (templates that ``trim`` it: Llama 3, Gemma). A content still not found (a template that escapes or
rewrites it) is taken as the text between the template's own text before and after its marker, when the rendered
string has that text there (``found="between"``). Otherwise it cannot be located: its span is ``None``
(``found=None``) and its tokens are counted as template tokens: they are still explained, never dropped, but not
attributed to the message. Contents the template does not write at all are not located either.

**Documents** go where the template puts them when it takes them (transformers' ``documents=`` argument; a template
takes them when a marker document appears in its rendering); otherwise a documents block is appended to the system
message the conversation opens with, or, without one, written at the start of the first user message (a new system
message would displace a template's default system prompt, and some templates refuse one: Gemma, Mistral)::

    Documents:

    [1] Title of the first
    Text of the first

    [2] Text of the second (no title)

The block's own text (``Documents:``, the numbers) is template text. :func:`render_prompt` writes the same block
before a plain prompt, separated by a blank line.

Control tokens inside a content (a message holding ``<|im_end|>``) are read as control tokens, as
``apply_chat_template`` does by default; they lie inside the content's span and count as the message's tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .errors import InvalidInputError
from .units import Segment

#: The roles a message may have.
ROLES = ("system", "user", "assistant")
#: The first line of the documents block written when the template takes no documents.
DOCUMENTS_HEADER = "Documents:"

Placement = Literal["template", "system", "user", "prompt"]
Found = Literal["exact", "stripped", "between"]


class NoChatTemplateError(InvalidInputError):
    """Messages were given for a model whose tokenizer has no chat template and none was configured."""


class ChatTemplateError(InvalidInputError):
    """The chat template refused the messages (it raised, e.g. "System role not supported")."""


class UnknownRoleError(InvalidInputError):
    """A message's role is not one of :data:`ROLES`."""


@dataclass(frozen=True)
class Message:
    """One chat message.

    Attributes:
        role: who speaks: one of :data:`ROLES` (``system``, ``user``, ``assistant``).
        content: what the message says.
    """

    role: str
    content: str


@dataclass(frozen=True)
class Document:
    """One document given to the model (retrieval-augmented generation).

    Attributes:
        text: the document's text.
        title: its title; may be empty.
    """

    text: str
    title: str = ""


@dataclass(frozen=True)
class PromptField:
    """Where one piece of the caller's input landed in the rendered prompt.

    Attributes:
        kind: ``message``, ``document`` or ``prompt``.
        index: the message's or document's index in the caller's list (0 for the prompt).
        part: ``content`` (a message), ``title`` or ``text`` (a document), ``prompt``.
        start: its first character in the rendered prompt (``None``: not located).
        end: one past its last character (``None``: not located).
        found: how it was located: ``exact``, ``stripped`` (without the white space at its ends) or ``between``
            (the text between the template's own text around it); ``None``: not located.
    """

    kind: str
    index: int
    part: str
    start: int | None = None
    end: int | None = None
    found: Found | None = None

    @property
    def label(self) -> tuple[str, int]:
        """The segment label of its tokens: ``(kind, index)``."""
        return (self.kind, self.index)


@dataclass(frozen=True)
class RenderedPrompt:
    """A prompt rendered from messages (or a plain prompt) and documents, tokenized with character offsets.

    Attributes:
        text: the rendered prompt.
        input_ids: its token ids.
        offsets: each token's ``(start, end)`` characters in ``text``, ``None`` for a token without characters
            (a BOS the tokenizer added).
        fields: where each message content, document title and text (or the prompt) landed.
        placement: where the documents went: ``template`` (the template's own document support), ``system``,
            ``user`` (the documents block in that message), ``prompt`` (before a plain prompt); ``None``: no
            documents.
    """

    text: str
    input_ids: tuple[int, ...]
    offsets: tuple[tuple[int, int] | None, ...]
    fields: tuple[PromptField, ...]
    placement: Placement | None = None

    def segments(self) -> tuple[Segment, ...]:
        """The located fields as :class:`~explainers.units.Segment` labelled ``(kind, index)``."""
        return tuple(
            Segment(field.start, field.end, field.label)
            for field in self.fields
            if field.start is not None and field.end is not None
        )

    def span(self, kind: str, index: int, part: str | None = None) -> tuple[int, int] | None:
        """The character span of a message's content, a document's ``text`` (or ``title``), the prompt.

        Args:
            kind: ``message``, ``document`` or ``prompt``.
            index: the message's or document's index in the caller's list (0 for the prompt).
            part: ``content``, ``title``, ``text`` or ``prompt``; ``None``: the kind's main part (a message's
                ``content``, a document's ``text``, the ``prompt``).

        Returns:
            ``(start, end)`` characters in :attr:`text`, or ``None`` when that part was not located.
        """
        wanted = part or {"message": "content", "document": "text", "prompt": "prompt"}[kind]
        for field in self.fields:
            if field.kind == kind and field.index == index and field.part == wanted:
                return None if field.start is None or field.end is None else (field.start, field.end)
        return None

    def token_labels(self) -> list[tuple[str, int] | None]:
        """Per token, ``(kind, index)`` of the field holding its anchor (first non-space character), ``None`` for a
        template token (the rule of :func:`explainers.units.token_units`)."""
        from .units import token_units

        units = token_units(self.text, self.offsets, "token", segments=self.segments())
        return [unit.label for unit in units]  # type: ignore[misc]


def chat_template_of(tokenizer: Any, override: str | None = None) -> str | None:
    """The template messages are rendered with: ``override`` (a model setting) if given, else the tokenizer's.

    Args:
        tokenizer: a Hugging Face tokenizer (its ``chat_template``, or the ``default`` one of several named ones).
        override: a Jinja chat template that replaces the tokenizer's; ``None`` or empty: the tokenizer's.

    Returns:
        The template, or ``None`` when there is none.
    """
    if override:
        return override
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, Mapping):  # several named templates: the default one
        template = template.get("default")
    return template if isinstance(template, str) and template else None


def check_messages(messages: Sequence[Any]) -> list[Message]:
    """The messages as :class:`Message`, checked: a non-empty list of ``{"role", "content"}`` with a known role.

    Raises:
        UnknownRoleError: for a role not in :data:`ROLES`.
        InvalidInputError: for anything else malformed.
    """
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise InvalidInputError("messages must be a non-empty list of {'role': ..., 'content': ...}")
    checked = []
    for index, message in enumerate(messages):
        if isinstance(message, Message):
            role, content = message.role, message.content
        elif isinstance(message, Mapping) and set(message) == {"role", "content"}:
            role, content = message["role"], message["content"]
        else:
            raise InvalidInputError(f"message {index} must be an object with exactly 'role' and 'content'")
        if not isinstance(role, str) or not isinstance(content, str):
            raise InvalidInputError(f"message {index}: 'role' and 'content' must be strings")
        if role not in ROLES:
            raise UnknownRoleError(f"message {index} has role {role!r}; roles: {', '.join(ROLES)}")
        checked.append(Message(role, content))
    if not any(message.content.strip() for message in checked):
        raise InvalidInputError("every message is empty: send at least one message with content")
    return checked


def check_documents(documents: Sequence[Any]) -> list[Document]:
    """The documents as :class:`Document`: strings, or ``{"text"}`` / ``{"title", "text"}`` objects.

    Raises:
        InvalidInputError: for a document of another form, or an empty text.
    """
    if isinstance(documents, str | bytes) or not isinstance(documents, Sequence):
        raise InvalidInputError("documents must be a list of strings or {'title': ..., 'text': ...} objects")
    checked = []
    for index, document in enumerate(documents):
        if isinstance(document, Document):
            title, text = document.title, document.text
        elif isinstance(document, str):
            title, text = "", document
        elif isinstance(document, Mapping) and "text" in document and set(document) <= {"title", "text"}:
            title, text = document.get("title") or "", document["text"]
        else:
            raise InvalidInputError(f"document {index} must be a string or an object with 'text' (and 'title')")
        if not isinstance(title, str) or not isinstance(text, str):
            raise InvalidInputError(f"document {index}: 'title' and 'text' must be strings")
        if not text.strip():
            raise InvalidInputError(f"document {index} has an empty text")
        checked.append(Document(text, title))
    return checked


def documents_block(
    documents: Sequence[Document], value: Callable[[int, str, str], str] | None = None
) -> tuple[str, dict[tuple[int, str], tuple[int, int]]]:
    """The documents block written where the template takes no documents (see the module docstring), and the
    character span of each document's ``title`` and ``text`` in it.

    Args:
        documents: the documents.
        value: ``value(index, part, original)`` → the string written for a title or text (markers, when probing).
    """
    write = value or (lambda _index, _part, original: original)
    block = DOCUMENTS_HEADER
    spans: dict[tuple[int, str], tuple[int, int]] = {}
    for index, document in enumerate(documents):
        block += f"\n\n[{index + 1}] "
        if document.title:
            title = write(index, "title", document.title)
            spans[(index, "title")] = (len(block), len(block) + len(title))
            block += title + "\n"
        text = write(index, "text", document.text)
        spans[(index, "text")] = (len(block), len(block) + len(text))
        block += text
    return block, spans


def render_chat(
    tokenizer: Any,
    messages: Sequence[Any],
    documents: Sequence[Any] = (),
    *,
    chat_template: str | None = None,
    add_generation_prompt: bool = True,
) -> RenderedPrompt:
    """Render ``messages`` (and ``documents``) with the chat template, tokenize, and locate every content.

    Args:
        tokenizer: a fast Hugging Face tokenizer (character offsets are needed).
        messages: ``{"role", "content"}`` mappings (or :class:`Message`), several turns.
        documents: strings, ``{"title", "text"}`` mappings or :class:`Document`.
        chat_template: a Jinja chat template to use instead of the tokenizer's.
        add_generation_prompt: end with the template's header of an assistant turn (what a reply follows).

    Returns:
        The :class:`RenderedPrompt`.

    Raises:
        NoChatTemplateError: if neither ``chat_template`` nor the tokenizer has a template.
        UnknownRoleError, InvalidInputError: for malformed messages or documents, a slow tokenizer.
        ChatTemplateError: if the template refuses the messages (its own message is kept).
    """
    template = chat_template_of(tokenizer, chat_template)
    if template is None:
        raise NoChatTemplateError(
            "this model has no chat template (its tokenizer has none and no chat_template setting is configured): "
            "send a 'prompt', or configure the model's chat_template"
        )
    _require_fast(tokenizer)
    chat = check_messages(messages)
    docs = check_documents(documents)
    _render(tokenizer, template, _message_dicts(chat, _identity), None, add_generation_prompt)
    placement = _placement(tokenizer, template, chat, docs, add_generation_prompt) if docs else None
    fields = [PromptField("message", index, "content") for index in range(len(chat))]
    for index, document in enumerate(docs):
        if document.title:
            fields.append(PromptField("document", index, "title"))
        fields.append(PromptField("document", index, "text"))
    markers = {(field.kind, field.index, field.part): _marker(position) for position, field in enumerate(fields)}

    def build(value: Callable[[str, int, str, str], str]) -> tuple[list[dict[str, str]], list[dict[str, str]] | None]:
        return _inputs(chat, docs, placement, value)

    text = _render(tokenizer, template, *build(_identity), add_generation_prompt)
    try:
        marked = build(lambda kind, index, part, _: markers[(kind, index, part)])
        probe: str | None = _render(tokenizer, template, *marked, add_generation_prompt)
    except ChatTemplateError:
        probe = None  # the template reads the contents (e.g. tests them): search in the caller's order
    located = _locate(text, probe, fields, markers, chat, docs)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return RenderedPrompt(
        text, tuple(encoded["input_ids"]), _offsets(encoded["offset_mapping"]), tuple(located), placement
    )


def render_prompt(tokenizer: Any, prompt: str, documents: Sequence[Any] = ()) -> RenderedPrompt:
    """A plain prompt (no chat template), after the documents block when documents are given, tokenized as the
    tokenizer does by default (its special tokens added: a BOS has no characters, its offsets are ``None``).

    Args:
        tokenizer: a fast Hugging Face tokenizer (offsets are read from it).
        prompt: the prompt text.
        documents: documents to put before the prompt (:class:`Document` or ``{"text", "title"}`` mappings).

    Returns:
        The :class:`RenderedPrompt`.

    Raises:
        InvalidInputError: for malformed documents or a slow tokenizer.
    """
    _require_fast(tokenizer)
    docs = check_documents(documents)
    fields: list[PromptField] = []
    text = prompt
    if docs:
        block, spans = documents_block(docs)
        fields = [
            PromptField("document", index, part, start, end, "exact") for (index, part), (start, end) in spans.items()
        ]
        text = block + "\n\n" + prompt
    fields.insert(0, PromptField("prompt", 0, "prompt", len(text) - len(prompt), len(text), "exact"))
    encoded = tokenizer(text, return_offsets_mapping=True)
    offsets = _offsets(encoded["offset_mapping"])
    return RenderedPrompt(text, tuple(encoded["input_ids"]), offsets, tuple(fields), "prompt" if docs else None)


def _require_fast(tokenizer: Any) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise InvalidInputError(
            "this model's tokenizer is not a fast tokenizer (no tokenizer.json): messages, documents and words need "
            "its character offsets; save the model's fast tokenizer with the checkpoint"
        )


def _offsets(mapping: Sequence[Sequence[int]]) -> tuple[tuple[int, int] | None, ...]:
    """The tokenizer's offsets, a token without characters (``(0, 0)``: a BOS it added) as ``None``."""
    return tuple((int(start), int(end)) if end > start else None for start, end in mapping)


def _identity(_kind: str, _index: int, _part: str, original: str) -> str:
    return original


def _marker(position: int) -> str:
    """A string no template writes and no trim removes: private-use characters around a number."""
    return f"\ue000{position}\ue001"


def _message_dicts(chat: Sequence[Message], value: Callable[[str, int, str, str], str]) -> list[dict[str, str]]:
    return [
        {"role": message.role, "content": value("message", index, "content", message.content)}
        for index, message in enumerate(chat)
    ]


def _inputs(
    chat: Sequence[Message],
    docs: Sequence[Document],
    placement: Placement | None,
    value: Callable[[str, int, str, str], str],
) -> tuple[list[dict[str, str]], list[dict[str, str]] | None]:
    """The messages and documents handed to the template, each content written by ``value`` (itself, or a
    marker), the documents block placed as ``placement`` says."""
    messages = _message_dicts(chat, value)
    if not docs:
        return messages, None
    if placement == "template":
        documents = []
        for index, document in enumerate(docs):
            entry = {"text": value("document", index, "text", document.text)}
            if document.title:
                entry["title"] = value("document", index, "title", document.title)
            documents.append(entry)
        return messages, documents
    block, _ = documents_block(docs, lambda index, part, original: value("document", index, part, original))
    if placement == "system":  # the conversation opens with a system message (see _placement)
        messages[0] = {"role": "system", "content": messages[0]["content"] + "\n\n" + block}
    else:
        first = next(index for index, message in enumerate(messages) if message["role"] == "user")
        messages[first] = {"role": "user", "content": block + "\n\n" + messages[first]["content"]}
    return messages, None


def _placement(
    tokenizer: Any, template: str, chat: Sequence[Message], docs: Sequence[Document], generation: bool
) -> Placement:
    """Where the documents go: the template's own support if a marker document shows in its rendering, else the
    system message the conversation opens with, else the first user message.

    Raises:
        ChatTemplateError: when the documents have nowhere to go (no system and no user message).
    """
    marker = _marker(-1)
    messages = _message_dicts(chat, _identity)
    try:
        if marker in _render(tokenizer, template, messages, [{"title": "", "text": marker}], generation):
            return "template"
    except ChatTemplateError:
        pass
    if chat[0].role == "system":
        return "system"
    if not any(message.role == "user" for message in chat):
        raise ChatTemplateError(
            "the chat template takes no documents and the messages have no system or user message to put them in"
        )
    return "user"


def _render(
    tokenizer: Any,
    template: str,
    messages: list[dict[str, str]],
    documents: list[dict[str, str]] | None,
    generation: bool,
) -> str:
    """The template's rendering (untokenized).

    Raises:
        ChatTemplateError: with the template's own message when it raises.
    """
    import jinja2

    try:
        rendered = tokenizer.apply_chat_template(
            messages,
            documents=documents,
            chat_template=template,
            add_generation_prompt=generation,
            tokenize=False,
        )
    except jinja2.TemplateError as error:
        raise ChatTemplateError(f"the chat template refused the messages: {error}") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as error:
        raise ChatTemplateError(f"the chat template failed on the messages ({type(error).__name__}: {error})") from None
    if not isinstance(rendered, str):
        raise ChatTemplateError(f"the chat template rendered a {type(rendered).__name__}, not a string")
    return rendered


def _locate(
    text: str,
    probe: str | None,
    fields: Sequence[PromptField],
    markers: Mapping[tuple[str, int, str], str],
    chat: Sequence[Message],
    docs: Sequence[Document],
) -> list[PromptField]:
    """Each field's span in ``text``, searched in the order the probe rendering writes them (see the module
    docstring); fields are returned in their own order."""

    def original(field: PromptField) -> str:
        if field.kind == "message":
            return chat[field.index].content
        document = docs[field.index]
        return document.title if field.part == "title" else document.text

    keys = [(field.kind, field.index, field.part) for field in fields]
    if probe is not None:
        at = {key: probe.find(markers[key]) for key in keys}
        order = sorted((position for position, key in enumerate(keys) if at[key] >= 0), key=lambda i: at[keys[i]])
    else:
        # No probe: messages in order, then documents in order, each run with its own cursor.
        order = list(range(len(fields)))
    located = list(fields)
    cursor = 0
    previous_kind: str | None = None
    for position in order:
        field = fields[position]
        if probe is None and field.kind != previous_kind:
            cursor = 0
        previous_kind = field.kind
        span = _find(text, original(field), cursor)
        if span is None and probe is not None:
            span = _between(text, probe, markers[keys[position]], cursor)
        if span is not None:
            start, end, found = span
            if any(other.start is not None and other.start < end and start < (other.end or 0) for other in located):
                continue  # overlaps a field found before (the no-probe search): leave it unlocated
            located[position] = PromptField(field.kind, field.index, field.part, start, end, found)
            cursor = end
    return located


def _find(text: str, value: str, cursor: int) -> tuple[int, int, Found] | None:
    """``value`` in ``text`` at or after ``cursor``: exactly, else without its surrounding white space."""
    if value:
        start = text.find(value, cursor)
        if start >= 0:
            return start, start + len(value), "exact"
    stripped = value.strip()
    if stripped and stripped != value:
        start = text.find(stripped, cursor)
        if start >= 0:
            return start, start + len(stripped), "stripped"
    return None


def _between(text: str, probe: str, marker: str, cursor: int) -> tuple[int, int, Found] | None:
    """The text between the template's own text around ``marker`` in the probe, when ``text`` has that text right
    at ``cursor``."""
    at = probe.find(marker)
    before_start = probe.rfind("\ue001", 0, at) + 1  # the end of the previous marker (or 0)
    after_end = probe.find("\ue000", at + len(marker))
    before = probe[before_start:at]
    after = probe[at + len(marker) : after_end if after_end >= 0 else len(probe)]
    if not text.startswith(before, cursor) or not after:
        return None
    start = cursor + len(before)
    end = text.find(after, start)
    if end <= start:
        return None
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end, "between") if start < end else None


def decoded_offsets(tokenizer: Any, ids: Sequence[int]) -> tuple[str, list[tuple[int, int] | None]]:
    """Generated tokens decoded (special tokens skipped, as an answer's text is) and each token's characters in
    that text.

    A token ends where the decoding of the tokens up to it ends, when that decoding is a prefix of the whole text.
    A token whose decoding is not (the first bytes of a character split over tokens, spaces a decoder cleans up)
    shares the characters of the next token that completes it, as a fast tokenizer's offsets do for a split
    character. Special tokens (EOS) have no characters (``None``).

    Args:
        tokenizer: the Hugging Face tokenizer that produced ``ids``.
        ids: the generated token ids.

    Returns:
        The text and the offsets, one per token.
    """
    special = {int(token) for token in getattr(tokenizer, "all_special_ids", [])}
    text = str(tokenizer.decode(list(ids), skip_special_tokens=True))
    offsets: list[tuple[int, int] | None] = []
    pending: list[int] = []
    end = 0
    for index, token in enumerate(ids):
        if int(token) in special:
            offsets.append(None)
            continue
        offsets.append((end, end))
        pending.append(index)
        prefix = str(tokenizer.decode(list(ids[: index + 1]), skip_special_tokens=True))
        if text.startswith(prefix) and len(prefix) >= end:
            for waiting in pending:
                offsets[waiting] = (end, len(prefix))
            end = len(prefix)
            pending = []
    for waiting in pending:
        offsets[waiting] = (end, len(text))
    return text, offsets
