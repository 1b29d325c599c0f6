"""chatkit: chat with local GGUF models where structure is guaranteed by construction.

The public names live here; each concept has its own module.
"""

from .constraints import Constraint
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
from .model import Model, SeqChunk
from .sampling import DraftAwareProcessor, LogitProcessor, Sampler, SamplingParams
from .schema import SchemaReader

__version__ = "0.1.0"

__all__ = [
    "AllTokensMasked",
    "ChatkitError",
    "Constraint",
    "ConstraintError",
    "DecodeError",
    "DraftAwareProcessor",
    "FinishReason",
    "Generation",
    "GenerationError",
    "GrammarInvalid",
    "InvalidParameter",
    "LogitProcessor",
    "Model",
    "ModelError",
    "ModelLoadError",
    "ModelNotFound",
    "Sampler",
    "SamplingParams",
    "SchemaInvalid",
    "SchemaReader",
    "SchemaUnsupported",
    "SchemaViolation",
    "SeqChunk",
    "SharedProcessorError",
    "TemplateError",
    "Truncated",
    "UserError",
    "__version__",
    "generate",
]
