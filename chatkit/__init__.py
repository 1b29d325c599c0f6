"""chatkit: chat with local GGUF models where structure is guaranteed by construction.

The public names live here; each concept has its own module.
"""

from .constraints import Constraint
from .conversation import Conversation, ReplyStream
from .decoding import FinishReason, Generation, generate
from .errors import (
    AllTokensMasked,
    ChatkitError,
    ConstraintError,
    DecodeError,
    GenerationError,
    GrammarInvalid,
    InvalidParameter,
    ModelError,
    ModelLoadError,
    ModelNotFound,
    SchemaInvalid,
    SchemaUnsupported,
    SchemaViolation,
    SharedProcessorError,
    TemplateError,
    Truncated,
    UserError,
)
from .messages import Message, Reply, ToolCall, Usage
from .model import Model, SeqChunk
from .sampling import DraftAwareProcessor, LogitProcessor, Sampler, SamplingParams
from .schema import SchemaReader
from .templates import ChatTemplate, Segment

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
    "Message",
    "Model",
    "ModelError",
    "ModelLoadError",
    "ModelNotFound",
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
    "ToolCall",
    "Truncated",
    "Usage",
    "UserError",
    "__version__",
    "generate",
]
