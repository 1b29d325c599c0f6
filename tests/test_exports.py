"""Exit codes are a contract (the public names are checked in tests/test_api.py)."""


def test_exit_codes_are_distinct() -> None:
    import inspect

    from chatkit import errors

    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass)
               if issubclass(c, errors.ChatkitError) and "exit_code" in vars(c)]
    codes = [c.exit_code for c in classes]
    assert len(codes) == len(set(codes)), codes
    assert all(c.exit_code not in (0,) for c in classes)
