"""Keyword arguments to the CLI's flags, and the CLI's messages back to argument names.

`plan` and `simulate` run the CLI's own flag parsing (so they equal `kvpage plan` and
`kvpage sim` for the same flags). A keyword argument becomes its flag only when it differs from
its default, which is the CLI's: the CLI then sees exactly the flags a user would type.
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Any, Callable, Dict, List, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_FLAG = re.compile(r"--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")


def flag_args(values: Dict[str, Any], defaults: Dict[str, Any]) -> List[str]:
    """`--name value` for each value that is not None and differs from its default.

    A bool whose default is True becomes `--no-name` when False; one whose default is False
    becomes `--name` when True. Lists and tuples are joined with commas.
    """
    args: List[str] = []
    for name, value in values.items():
        if value is None or (name in defaults and _same(value, defaults[name])):
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, (list, tuple)):
            args += [flag, ",".join(str(v) for v in value)]
        elif isinstance(value, float):
            args += [flag, repr(value)]
        else:
            args += [flag, str(value)]
    return args


def _same(value: Any, default: Any) -> bool:
    return type(value) is type(default) and value == default


def rename_flags(message: str) -> str:
    """'--block-size must be ...' -> 'block_size must be ...'."""
    return _FLAG.sub(lambda m: m.group(1).replace("-", "_"), message)


def python_messages(function: F) -> F:
    """Re-raises the module's exceptions with flags named as keyword arguments."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except (ValueError, KeyError, MemoryError, RuntimeError) as error:
            if type(error) not in (ValueError, KeyError, MemoryError, RuntimeError):
                raise
            message = error.args[0] if error.args else ""
            renamed = rename_flags(str(message))
            if renamed == message:
                raise
            raise type(error)(renamed) from None

    wrapper.__signature__ = inspect.signature(function)  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def signature_defaults(function: Callable[..., Any]) -> Dict[str, Any]:
    """The keyword-only parameters' defaults."""
    return {
        name: p.default
        for name, p in inspect.signature(function).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
