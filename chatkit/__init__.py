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
    from .chat.batch import BatchItem, asend_batch, send_batch
    from .chat.conversation import Conversation
    from .chat.options import TurnOptions
    from .chat.partial import FieldEvent, Partial
    from .chat.quorum import QuorumOptions, QuorumResult, aquorum, quorum
    from .chat.runner import AsyncReplyStream, ReplyStream
    from .chat.scheduler import EngineLoop, Ticket, engine_loop
    from .decode.decoding import Generation, generate
    from .decode.sampling import (
        CheckingProcessor,
        DraftAwareProcessor,
        GrammarProcessor,
        LogitProcessor,
        Sampler,
        SamplingParams,
    )
    from .decode.speculative import ConstrainedSource, CostGate, DraftSource, PromptLookupSource
    from .engine.backends import BuildInfo, Device
    from .engine.model import Model, Placement, build_info
    from .engine.protocols import (
        Engine,
        GenerateEngine,
        GenerateRequest,
        GenerateResult,
        SeqChunk,
        StepEngine,
        Vocabulary,
    )
    from .grammar.constraints import Constraint
    from .grammar.schema import SchemaInput, SchemaReader
    from .messages import (
        ChoiceProbabilities,
        FinishReason,
        Message,
        Reply,
        Role,
        TokenLogprob,
        ToolCall,
        Usage,
    )
    from .remote.engine import RemoteEngine
    from .templates import ChatTemplate, Segment
    from .tools import ModelRetry, Tool, ToolDefinition, ToolLike, Toolset, tool
    from .tools.execute import ToolResult, execute_calls
    from .tools.mcp import MCPToolset

_LAZY = {
    "ToolResult": "tools.execute",
    "execute_calls": "tools.execute",
    "BuildInfo": "engine.backends",
    "Device": "engine.backends",
    "BatchItem": "chat.batch",
    "asend_batch": "chat.batch",
    "send_batch": "chat.batch",
    "Constraint": "grammar.constraints",
    "GrammarLimits": "grammar.limits",
    "grammar_limits": "grammar.limits",
    "set_grammar_limits": "grammar.limits",
    "AsyncReplyStream": "chat.runner",
    "ChoiceProbabilities": "messages",
    "FieldEvent": "chat.partial",
    "Partial": "chat.partial",
    "Conversation": "chat.conversation",
    "ReplyStream": "chat.runner",
    "Generation": "decode.decoding",
    "generate": "decode.decoding",
    "Engine": "engine.protocols",
    "GenerateEngine": "engine.protocols",
    "GenerateRequest": "engine.protocols",
    "GenerateResult": "engine.protocols",
    "SeqChunk": "engine.protocols",
    "StepEngine": "engine.protocols",
    "Vocabulary": "engine.protocols",
    "FinishReason": "messages",
    "Message": "messages",
    "Reply": "messages",
    "Role": "messages",
    "ToolCall": "messages",
    "TokenLogprob": "messages",
    "Usage": "messages",
    "MCPToolset": "tools.mcp",
    "Model": "engine.model",
    "Placement": "engine.model",
    "build_info": "engine.model",
    "QuorumOptions": "chat.quorum",
    "QuorumResult": "chat.quorum",
    "aquorum": "chat.quorum",
    "quorum": "chat.quorum",
    "CheckingProcessor": "decode.sampling",
    "DraftAwareProcessor": "decode.sampling",
    "GrammarProcessor": "decode.sampling",
    "LogitProcessor": "decode.sampling",
    "Sampler": "decode.sampling",
    "SamplingParams": "decode.sampling",
    "RemoteEngine": "remote.engine",
    "EngineLoop": "chat.scheduler",
    "Ticket": "chat.scheduler",
    "engine_loop": "chat.scheduler",
    "SchemaInput": "grammar.schema",
    "SchemaReader": "grammar.schema",
    "ConstrainedSource": "decode.speculative",
    "CostGate": "decode.speculative",
    "DraftSource": "decode.speculative",
    "PromptLookupSource": "decode.speculative",
    "ChatTemplate": "templates",
    "Segment": "templates",
    "ModelRetry": "tools",
    "Tool": "tools",
    "ToolDefinition": "tools",
    "ToolLike": "tools",
    "Toolset": "tools",
    "tool": "tools",
    "TurnOptions": "chat.options",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'chatkit' has no attribute {name!r}")
    import importlib

    loaded = importlib.import_module(f".{module}", __name__)
    # Bind every name of that module now: importing ``chatkit.chat.quorum`` also sets the
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
    "GrammarLimits",
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
    "ToolLike",
    "ToolResult",
    "ToolServerError",
    "Toolset",
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
    "grammar_limits",
    "quorum",
    "send_batch",
    "set_grammar_limits",
    "tool",
]
