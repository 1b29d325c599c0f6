"""Pins the public names (DESIGN.md: they are a contract)."""

import chatkit


def test_public_names_are_pinned() -> None:
    assert sorted(chatkit.__all__) == sorted([
        "AllTokensMasked", "ChatTemplate", "ChatkitError", "Constraint", "ConstraintError",
        "Conversation", "DecodeError", "Message", "Reply", "ReplyStream", "Segment", "ToolCall",
        "Usage",
        "DraftAwareProcessor", "FinishReason", "Generation", "GenerationError", "GrammarInvalid",
        "InvalidParameter", "LogitProcessor", "Model", "ModelError", "ModelLoadError",
        "ModelNotFound", "Sampler", "SamplingParams", "SchemaInvalid", "SchemaReader",
        "SchemaUnsupported", "SchemaViolation", "SeqChunk", "SharedProcessorError",
        "TemplateError", "Truncated", "UserError", "__version__", "generate", "send_batch",
        "asend_batch", "quorum", "QuorumResult", "MaxStepsExceeded", "ToolArgumentsInvalid",
        "ToolDefinitionError",
    ])
    for name in chatkit.__all__:
        assert hasattr(chatkit, name), name


def test_exit_codes_are_distinct() -> None:
    import inspect

    from chatkit import errors

    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass)
               if issubclass(c, errors.ChatkitError) and "exit_code" in vars(c)]
    codes = [c.exit_code for c in classes]
    assert len(codes) == len(set(codes)), codes
    assert all(c.exit_code not in (0,) for c in classes)
