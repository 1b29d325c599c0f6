"""Chat templates: sandboxed Jinja that renders messages into segment-safe prompts.

Job: a model's own template rendered exactly as the reference renderer does, the
bundled templates, segments (the renderer: ``render.py``). May import: ``errors``,
``messages``, ``engine``.
Never imports: grammar, decode, tools, chat, serve, remote.

A GGUF's embedded template is untrusted input: it is rendered in jinja2's
``ImmutableSandboxedEnvironment`` with what Hugging Face transformers'
reference renderer offers templates (``raise_exception``, ``strftime_now``,
``namespace``, loop controls, the ``{% generation %}`` tag, a ``tojson`` that
does not HTML-escape and takes ``indent``/``ensure_ascii``/``separators``/
``sort_keys``) and nothing more, except that lists and dicts the template built itself
may change (``append``, ``pop``, ``update``, as llama.cpp's renderer allows: Kimi K2 queues
its call ids so) while the caller's stay immutable; anything the sandbox refuses, and any other
render failure, is ``TemplateError``. The text is the reference renderer's text,
byte for byte.

Segment safety without assuming simple templates: every occurrence of a
special-token text (``<|im_end|>``, ``[INST]``, ...) inside any string the
caller supplied (message contents, reasoning, tool-call arguments, tool
results, tool descriptions) is swapped for an ASCII marker before rendering.
Markers survive what templates do to content (``|trim``, ``.split()``,
``tojson``, slicing, ``startswith``, reversed iteration), so after rendering
they show exactly where content put special-token text; those spans become
``content`` segments (tokenized without special-token parsing) and the rest is
``markup``. The marked rendering, with the markers put back, must equal the
plain rendering; a template whose output depends on those strings inside
content is refused (``TemplateError``) rather than tokenized unsafely.
"""

from .render import BUNDLED as BUNDLED
from .render import COMMON_SPECIAL_TEXTS as COMMON_SPECIAL_TEXTS
from .render import RENDER_CHARS as RENDER_CHARS
from .render import RENDER_SECONDS as RENDER_SECONDS
from .render import ChatTemplate, Segment
from .render import content_ids as content_ids
from .render import fold_system as fold_system
from .render import message_dict as message_dict
from .render import single_control as single_control
from .render import tokenize_segments as tokenize_segments

__all__ = ["ChatTemplate", "Segment"]
