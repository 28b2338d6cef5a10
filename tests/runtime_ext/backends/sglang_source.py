"""SGLang 0.5.23's own source, read as text from the installed wheel (the runtime cannot be imported here: it needs
zmq, triton, CUDA ...): the line that causes a behaviour, a method's code run on stand-in objects, a pydantic model
of a request class's fields.  Tests that mirror SGLang pin themselves to these lines, so a version bump that moves
or changes one fails them instead of letting the stand-in or the client drift silently."""

from __future__ import annotations

import __future__
import ast
import importlib.util
import textwrap
import typing
from pathlib import Path
from typing import Any, Callable

import pydantic

SGLANG = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])


def source_lines(path: str) -> list[str]:
    """The lines of `site-packages/sglang/<path>` (1-based: element 0 is line 1)."""
    return (SGLANG / path).read_text(encoding="utf-8").splitlines()


def line(path: str, lineno: int) -> str:
    """Line `lineno` of `site-packages/sglang/<path>`, stripped."""
    return source_lines(path)[lineno - 1].strip()


def _tree(path: str) -> ast.Module:
    return ast.parse((SGLANG / path).read_text(encoding="utf-8"))


def class_def(path: str, name: str) -> ast.ClassDef:
    return next(n for n in _tree(path).body if isinstance(n, ast.ClassDef) and n.name == name)


def method_def(path: str, cls: str, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    return next(n for n in class_def(path, cls).body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name)


def function_def(path: str, name: str) -> ast.FunctionDef:
    return next(n for n in _tree(path).body if isinstance(n, ast.FunctionDef) and n.name == name)


def compile_function(node: ast.FunctionDef, namespace: dict[str, Any], path: str) -> Callable[..., Any]:
    """SGLang's function or method `node`, decorators and annotations dropped, defined in `namespace`."""
    node = ast.parse(textwrap.dedent(ast.unparse(node))).body[0]
    node.decorator_list = []
    node.returns = None
    for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
        a.annotation = None
    ns = dict(namespace)
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(SGLANG / path), "exec"), ns)  # noqa: S102
    return ns[node.name]


def compile_class(path: str, name: str, namespace: dict[str, Any]) -> type:
    """SGLang's class `name` of `path`, defined in `namespace` (annotations are not evaluated)."""
    ns = dict(namespace)
    module = ast.Module(body=[class_def(path, name)], type_ignores=[])
    exec(compile(module, str(SGLANG / path), "exec", flags=__future__.annotations.compiler_flag), ns)  # noqa: S102
    return ns[name]


def compile_statements(path: str, first: int, last: int, params: str, namespace: dict[str, Any]) -> Callable:
    """Lines `first`..`last` of `path` (whole statements) as the body of `def block(<params>)`."""
    body = textwrap.dedent("\n".join(source_lines(path)[first - 1:last]))
    src = f"def block({params}):\n" + textwrap.indent(body, "    ")
    ns = dict(namespace)
    exec(compile(src, f"{SGLANG / path}:{first}-{last}", "exec"), ns)  # noqa: S102
    return ns["block"]


class _AnyForUnknown(dict):
    def __missing__(self, key: str) -> Any:
        return typing.Any


def _annotation_names() -> _AnyForUnknown:
    names = _AnyForUnknown({k: getattr(typing, k) for k in typing.__all__})
    names.update(PlainValidator=lambda fn: None, List=list, Dict=dict, Tuple=tuple, Optional=typing.Optional)
    return names


def request_model(path: str, name: str, *, all_optional: bool = False) -> type[pydantic.BaseModel]:
    """A pydantic model of class `name`'s annotated fields in `path` (with those of its base classes defined in
    the same file, e.g. io_struct.BaseReq's rid), unknown keys refused (stricter than SGLang, which ignores a
    misspelled key); names SGLang defines elsewhere become Any.  A field without a default is required unless
    `all_optional`."""
    tree = _tree(path)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    chain, todo = [], [name]
    while todo:
        cls = classes[todo.pop()]
        chain.append(cls)
        todo.extend(b.id for b in cls.bases if isinstance(b, ast.Name) and b.id in classes)
    names = _annotation_names()
    fields: dict[str, Any] = {}
    for cls in reversed(chain):  # base classes first, subclasses override
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                required = node.value is None and not all_optional
                fields[node.target.id] = (eval(ast.unparse(node.annotation), {}, names),  # noqa: S307
                                          ... if required else None)
    return pydantic.create_model(name, __config__=pydantic.ConfigDict(extra="forbid"), **fields)
