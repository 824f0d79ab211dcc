"""The argument schemas of the library's ``torch.library`` custom ops.

Each custom op has one ``NamedTuple`` naming its arguments in order. The op function is declared
with :func:`op_schema` (which checks that its parameters are the schema's fields), its fake
implementation and its ``setup_context`` read the arguments as ``Schema(*inputs)`` by name, its
backward returns :func:`grads` of the schema (a gradient per argument by name, None for the rest),
and callers build the arguments as a ``Schema(...)`` with keywords and call ``op(*args)``.

Standard library only, so that every layer that defines an op (kernels, core, losses, nn, align)
can use it.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Tuple, Type, TypeVar

__all__ = ["SCHEMAS", "op_schema", "grads"]

#: ``{"module.function": schema}`` of every op function declared with :func:`op_schema`
SCHEMAS: Dict[str, Type[tuple]] = {}

F = TypeVar("F", bound=Callable[..., Any])


def op_schema(schema: Type[tuple]) -> Callable[[F], F]:
    """Declares ``schema`` (a NamedTuple class) the arguments of the op function it decorates.

    Raises:
        TypeError: the function's parameters are not the schema's fields, in order.
    """
    fields = tuple(getattr(schema, "_fields", ()))

    def deco(fn: F) -> F:
        params = tuple(inspect.signature(fn).parameters)
        if params != fields:
            raise TypeError(f"{fn.__qualname__}: parameters {params} are not the fields of {schema.__name__} {fields}")
        SCHEMAS[f"{fn.__module__}.{fn.__name__}"] = schema
        return fn

    return deco


def grads(schema: Type[tuple], **given: Any) -> Tuple[Any, ...]:
    """The backward's return value: ``given[f]`` for each field ``f`` of ``schema`` named in
    ``given``, None for the others (the arguments without a gradient).

    Raises:
        TypeError: a name of ``given`` is not a field of ``schema``.
    """
    fields = schema._fields  # type: ignore[attr-defined]
    unknown = set(given) - set(fields)
    if unknown:
        raise TypeError(f"{schema.__name__} has no argument {sorted(unknown)}")
    return tuple(given.get(f) for f in fields)
