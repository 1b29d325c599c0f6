"""chatkit: chat with local GGUF models where structure is guaranteed by construction.

The public names live here; each concept has its own module. Everything but the
errors is imported on first use, so ``chatkit run`` can refuse a bad schema
before llama.cpp loads. ``tests/test_exports.py`` checks that every name a module
lists in its ``__all__`` is exported here, and nothing else.
"""

from typing import TYPE_CHECKING, Any

from .errors import (
    AllTokensMasked,
    ChatkitError,
    ChecksExhausted,
    ConstraintError,
    ContextOverflow,
    DecodeError,
    EngineBusy,
    GenerationError,
    GrammarInvalid,
    InvalidParameter,
    MaxStepsExceeded,
    ModelError,
    ModelLoadError,
    ModelNotFound,
    RemoteError,
    RemoteUnsupported,
    SchemaInvalid,
    SchemaUnsupported,
    SchemaViolation,
    SharedProcessorError,
    TemplateError,
    ToolArgumentsInvalid,
    ToolDefinitionError,
    ToolFormatUnsupported,
    ToolServerError,
    Truncated,
    UserError,
)

if TYPE_CHECKING:
    from .agent import ToolResult, execute_calls
    from .backends import BuildInfo, Device
    from .batch import BatchItem, asend_batch, send_batch
    from .choices import ChoiceProbabilities
    from .constraints import Constraint
    from .conversation import Conversation
    from .decoding import Generation, generate
    from .engine import (
        Engine,
        GenerateEngine,
        GenerateRequest,
        GenerateResult,
        SeqChunk,
        StepEngine,
        Vocabulary,
    )
    from .mcp import MCPToolset
    from .messages import FinishReason, Message, Reply, Role, TokenLogprob, ToolCall, Usage
    from .model import Model, Placement, build_info
    from .options import TurnOptions
    from .partial import FieldEvent, Partial
    from .quorum import QuorumOptions, QuorumResult, aquorum, quorum
    from .remote import RemoteEngine
    from .runner import AsyncReplyStream, ReplyStream
    from .sampling import (
        CheckingProcessor,
        DraftAwareProcessor,
        GrammarProcessor,
        LogitProcessor,
        Sampler,
        SamplingParams,
    )
    from .scheduler import EngineLoop, Ticket, engine_loop
    from .schema import SchemaInput, SchemaReader
    from .speculative import ConstrainedSource, CostGate, DraftSource, PromptLookupSource
    from .templates import ChatTemplate, Segment
    from .tools import ModelRetry, Tool, ToolDefinition, tool

_LAZY = {
    "ToolResult": "agent",
    "execute_calls": "agent",
    "BuildInfo": "backends",
    "Device": "backends",
    "BatchItem": "batch",
    "asend_batch": "batch",
    "send_batch": "batch",
    "Constraint": "constraints",
    "AsyncReplyStream": "runner",
    "ChoiceProbabilities": "choices",
    "FieldEvent": "partial",
    "Partial": "partial",
    "Conversation": "conversation",
    "ReplyStream": "runner",
    "Generation": "decoding",
    "generate": "decoding",
    "Engine": "engine",
    "GenerateEngine": "engine",
    "GenerateRequest": "engine",
    "GenerateResult": "engine",
    "SeqChunk": "engine",
    "StepEngine": "engine",
    "Vocabulary": "engine",
    "FinishReason": "messages",
    "Message": "messages",
    "Reply": "messages",
    "Role": "messages",
    "ToolCall": "messages",
    "TokenLogprob": "messages",
    "Usage": "messages",
    "MCPToolset": "mcp",
    "Model": "model",
    "Placement": "model",
    "build_info": "model",
    "QuorumOptions": "quorum",
    "QuorumResult": "quorum",
    "aquorum": "quorum",
    "quorum": "quorum",
    "CheckingProcessor": "sampling",
    "DraftAwareProcessor": "sampling",
    "GrammarProcessor": "sampling",
    "LogitProcessor": "sampling",
    "Sampler": "sampling",
    "SamplingParams": "sampling",
    "RemoteEngine": "remote",
    "EngineLoop": "scheduler",
    "Ticket": "scheduler",
    "engine_loop": "scheduler",
    "SchemaInput": "schema",
    "SchemaReader": "schema",
    "ConstrainedSource": "speculative",
    "CostGate": "speculative",
    "DraftSource": "speculative",
    "PromptLookupSource": "speculative",
    "ChatTemplate": "templates",
    "Segment": "templates",
    "ModelRetry": "tools",
    "Tool": "tools",
    "ToolDefinition": "tools",
    "tool": "tools",
    "TurnOptions": "options",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'chatkit' has no attribute {name!r}")
    import importlib

    loaded = importlib.import_module(f".{module}", __name__)
    # Bind every name of that module now: importing ``chatkit.quorum`` also sets the
    # package attribute ``quorum`` to the submodule, which the function must replace.
    for other, where in _LAZY.items():
        if where == module:
            globals()[other] = getattr(loaded, other)
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(__all__)


__version__ = "0.1.0"

__all__ = [
    "AllTokensMasked",
    "AsyncReplyStream",
    "BatchItem",
    "BuildInfo",
    "ChatTemplate",
    "ChatkitError",
    "CheckingProcessor",
    "ChecksExhausted",
    "ChoiceProbabilities",
    "ConstrainedSource",
    "Constraint",
    "ConstraintError",
    "ContextOverflow",
    "Conversation",
    "CostGate",
    "DecodeError",
    "Device",
    "DraftAwareProcessor",
    "DraftSource",
    "Engine",
    "EngineBusy",
    "EngineLoop",
    "FieldEvent",
    "FinishReason",
    "GenerateEngine",
    "GenerateRequest",
    "GenerateResult",
    "Generation",
    "GenerationError",
    "GrammarInvalid",
    "GrammarProcessor",
    "InvalidParameter",
    "LogitProcessor",
    "MCPToolset",
    "MaxStepsExceeded",
    "Message",
    "Model",
    "ModelError",
    "ModelLoadError",
    "ModelNotFound",
    "ModelRetry",
    "Partial",
    "Placement",
    "PromptLookupSource",
    "QuorumOptions",
    "QuorumResult",
    "RemoteEngine",
    "RemoteError",
    "RemoteUnsupported",
    "Reply",
    "ReplyStream",
    "Role",
    "Sampler",
    "SamplingParams",
    "SchemaInput",
    "SchemaInvalid",
    "SchemaReader",
    "SchemaUnsupported",
    "SchemaViolation",
    "Segment",
    "SeqChunk",
    "SharedProcessorError",
    "StepEngine",
    "TemplateError",
    "Ticket",
    "TokenLogprob",
    "Tool",
    "ToolArgumentsInvalid",
    "ToolCall",
    "ToolDefinition",
    "ToolDefinitionError",
    "ToolFormatUnsupported",
    "ToolResult",
    "ToolServerError",
    "Truncated",
    "TurnOptions",
    "Usage",
    "UserError",
    "Vocabulary",
    "__version__",
    "aquorum",
    "asend_batch",
    "build_info",
    "engine_loop",
    "execute_calls",
    "generate",
    "quorum",
    "send_batch",
    "tool",
]
