"""chatkit: chat with local GGUF models where structure is guaranteed by construction.

The public names live here; each concept has its own module.
"""

from typing import TYPE_CHECKING, Any

from .errors import (
    AllTokensMasked,
    ChatkitError,
    ConstraintError,
    DecodeError,
    GenerationError,
    GrammarInvalid,
    InvalidParameter,
    MaxStepsExceeded,
    ModelError,
    ModelLoadError,
    ModelNotFound,
    SchemaInvalid,
    SchemaUnsupported,
    SchemaViolation,
    SharedProcessorError,
    TemplateError,
    ToolArgumentsInvalid,
    ToolDefinitionError,
    Truncated,
    UserError,
)

if TYPE_CHECKING:
    from .batch import asend_batch, send_batch
    from .constraints import Constraint
    from .conversation import Conversation, ReplyStream
    from .decoding import FinishReason, Generation, generate
    from .messages import Message, Reply, ToolCall, Usage
    from .model import Model, SeqChunk
    from .quorum import QuorumResult, quorum
    from .sampling import DraftAwareProcessor, LogitProcessor, Sampler, SamplingParams
    from .schema import SchemaReader
    from .templates import ChatTemplate, Segment

# Imported on first use, so `chatkit run` can refuse a bad schema before llama.cpp loads.
_LAZY = {
    "send_batch": "batch",
    "asend_batch": "batch",
    "quorum": "quorum",
    "QuorumResult": "quorum",
    "Constraint": "constraints",
    "Conversation": "conversation",
    "ReplyStream": "conversation",
    "FinishReason": "decoding",
    "Generation": "decoding",
    "generate": "decoding",
    "Message": "messages",
    "Reply": "messages",
    "ToolCall": "messages",
    "Usage": "messages",
    "Model": "model",
    "SeqChunk": "model",
    "DraftAwareProcessor": "sampling",
    "LogitProcessor": "sampling",
    "Sampler": "sampling",
    "SamplingParams": "sampling",
    "SchemaReader": "schema",
    "ChatTemplate": "templates",
    "Segment": "templates",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'chatkit' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__version__ = "0.1.0"

__all__ = [
    "AllTokensMasked",
    "ChatTemplate",
    "ChatkitError",
    "Constraint",
    "ConstraintError",
    "Conversation",
    "DecodeError",
    "DraftAwareProcessor",
    "FinishReason",
    "Generation",
    "GenerationError",
    "GrammarInvalid",
    "InvalidParameter",
    "LogitProcessor",
    "MaxStepsExceeded",
    "Message",
    "Model",
    "ModelError",
    "ModelLoadError",
    "ModelNotFound",
    "QuorumResult",
    "Reply",
    "ReplyStream",
    "Sampler",
    "SamplingParams",
    "SchemaInvalid",
    "SchemaReader",
    "SchemaUnsupported",
    "SchemaViolation",
    "Segment",
    "SeqChunk",
    "SharedProcessorError",
    "TemplateError",
    "ToolArgumentsInvalid",
    "ToolCall",
    "ToolDefinitionError",
    "Truncated",
    "Usage",
    "UserError",
    "__version__",
    "asend_batch",
    "generate",
    "quorum",
    "send_batch",
]
