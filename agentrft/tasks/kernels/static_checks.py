"""Gate 1 of the kernel grader: static (AST) checks on the submitted code, before any of it runs.

Each check stops a reward hack seen in kernel-writing RL (the talk's Mako case named returning
the reference, no-op and identity kernels) or one found while building this recipe:

    check                          stops
    kernel_defined                 no kernel at all; a kernel with the wrong number of arguments
    reachable                      helpers defined but never called from `kernel` (a kernel that
                                   exists but is never "launched")
    no_reference                   calling `reference`, importing the task's module, calling an
                                   op the task forbids (the op the reference *is*)
    not_a_copy                     the reference's code pasted back, renamed (AST near-copy)
    not_noop_or_identity           returning nothing, a constant, an input, a view or copy of an
                                   input, or an uninitialized/constant buffer
    no_state                       caches across calls: globals, mutable module state, mutable
                                   default arguments, decorators (lru_cache), attribute writes
    no_harness_access              timing and the harness: time/perf_counter, torch.utils.benchmark,
                                   monkeypatching, globals/builtins/inspect/importlib/os/sys/
                                   subprocess, files, threads, private or dunder attributes,
                                   classes (tensor subclasses, lazy objects), try/except (errors
                                   swallowed into zeros), generators

Only `import torch`, `import torch.nn.functional as F` (or `from torch.nn import functional`),
`import numpy as np` and `import math` are allowed. The checks err on the side of refusing:
a kernel needs none of what they refuse.
"""

from __future__ import annotations

import ast
import difflib
import io
import tokenize
from collections.abc import Iterable
from typing import Any

ALLOWED_MODULES = frozenset({"torch", "torch.nn", "torch.nn.functional", "numpy", "math"})
BANNED_NAMES = frozenset(
    {
        "reference",
        "eval",
        "exec",
        "compile",
        "__import__",
        "globals",
        "locals",
        "vars",
        "getattr",
        "setattr",
        "delattr",
        "open",
        "input",
        "breakpoint",
        "exit",
        "quit",
        "help",
        "dir",
        "type",
        "object",
        "super",
        "memoryview",
        "classmethod",
        "staticmethod",
        "property",
    }
)
BANNED_ATTRS = frozenset(
    {
        "perf_counter",
        "perf_counter_ns",
        "process_time",
        "monotonic",
        "time",
        "time_ns",
        "sleep",
        "benchmark",
        "utils",
        "load",
        "save",
        "from_file",
        "fromfile",
        "tofile",
        "memmap",
        "set_num_threads",
        "set_num_interop_threads",
        "compile",
        "jit",
        "backends",
        "overrides",
        "library",
        "ops",
        "hub",
        "multiprocessing",
        "distributed",
        "fx",
        "ctypeslib",
        "lib",
        "testing",
        "reference",
    }
)
# calls that hand an input back unchanged (or as a view or copy)
PASSTHROUGH = frozenset(
    {
        "clone",
        "view",
        "view_as",
        "reshape",
        "reshape_as",
        "contiguous",
        "detach",
        "copy",
        "to",
        "float",
        "double",
        "type_as",
        "as_tensor",
        "asarray",
        "array",
        "tensor",
        "from_numpy",
        "numpy",
        "squeeze",
        "unsqueeze",
        "flatten",
        "ravel",
        "expand",
        "expand_as",
        "requires_grad_",
        "cpu",
        "clone_",
        "identity",
    }
)
# buffers whose content is not computed from the inputs
BLANK = frozenset(
    {
        "empty",
        "empty_like",
        "new_empty",
        "zeros",
        "zeros_like",
        "new_zeros",
        "ones",
        "ones_like",
        "new_ones",
        "full",
        "full_like",
        "new_full",
        "empty_strided",
    }
)
WITH_ALLOWED = frozenset({"no_grad", "inference_mode"})
COPY_RATIO = 0.85  # normalized token similarity at or above which a kernel is the reference
COPY_COVERAGE = 0.9  # share of the reference's tokens found, in order, in the kernel


def problems(code: str | None, item: dict[str, Any]) -> list[str]:
    """Why this submission may not run, as (check, reason) lines; empty: it passes the gate."""
    if code is None:
        return ["kernel_defined: no ```python block with a `def kernel(...)` in the answer"]
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return [f"kernel_defined: not valid Python (line {exc.lineno}: {exc.msg})"]
    ref_tree = ast.parse(str(item.get("reference") or "def reference():\n    pass\n"))
    ref_fn = _function(ref_tree, "reference")
    n_args = len(ref_fn.args.args) if ref_fn is not None else None
    found: list[str] = []
    found += _module_level(tree)
    found += _banned(tree, set(item.get("forbid") or []))
    kernel = _function(tree, "kernel")
    if kernel is None:
        found.append("kernel_defined: no top-level `def kernel(...)`")
        return found
    if n_args is not None and (
        len(kernel.args.args) + len(kernel.args.posonlyargs) != n_args
        or kernel.args.vararg
        or kernel.args.kwarg
    ):
        found.append(f"kernel_defined: kernel must take exactly {n_args} positional arguments")
    found += _reachability(tree)
    found += _noop_or_identity(kernel)
    if ref_fn is not None:
        found += _near_copy(kernel, ref_fn, tree)
    return found


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    return fns[-1] if fns else None


def _immutable_literal(node: ast.AST) -> bool:
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False

    def frozen(v: Any) -> bool:
        if isinstance(v, tuple):
            return all(frozen(x) for x in v)
        return v is None or isinstance(v, bool | int | float | complex | str | bytes)

    return frozen(value)


def _module_level(tree: ast.Module) -> list[str]:
    """Top level: allowed imports, functions without decorators, constants, a docstring."""
    found = []
    for i, node in enumerate(tree.body):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name not in ALLOWED_MODULES:
                    found.append(
                        f"no_harness_access: imports {alias.name} (allowed: {', '.join(sorted(ALLOWED_MODULES))})"
                    )
        elif isinstance(node, ast.ImportFrom):
            if node.level or node.module not in ALLOWED_MODULES:
                found.append(f"no_harness_access: imports from {node.module or '.'}")
        elif isinstance(node, ast.FunctionDef):
            if node.decorator_list:
                found.append(
                    f"no_state: `{node.name}` has a decorator (caches such as lru_cache keep outputs across calls)"
                )
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if not all(isinstance(t, ast.Name) for t in targets) or (
                node.value is None or not _immutable_literal(node.value)
            ):
                found.append(
                    f"no_state: line {node.lineno}: module-level assignments hold constants only (no caches, no state)"
                )
        elif i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # docstring
        else:
            found.append(
                f"no_state: line {node.lineno}: top-level `{type(node).__name__}`: only imports, functions and constants"
            )
    return found


def _banned(tree: ast.Module, forbid: set[str]) -> list[str]:
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", "?")
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = {a.name.split(".")[-1] for a in node.names} | {
                a.asname for a in node.names if a.asname
            }
            if isinstance(node, ast.ImportFrom) and node.module:
                names |= set(node.module.split("."))
            if hits := names & (forbid | BANNED_NAMES | BANNED_ATTRS):
                found.append(f"no_reference: line {line}: imports {', '.join(sorted(hits))}")
            if node not in tree.body:
                found.append(f"no_harness_access: line {line}: imports inside a function")
        elif isinstance(node, ast.Name):
            if node.id in forbid:
                found.append(
                    f"no_reference: line {line}: uses {node.id}, which this task forbids (it is the reference's op)"
                )
            elif node.id == "reference":
                found.append(f"no_reference: line {line}: uses `reference`")
            elif node.id in BANNED_NAMES or node.id.startswith("__"):
                found.append(f"no_harness_access: line {line}: uses `{node.id}`")
        elif isinstance(node, ast.Attribute):
            if node.attr in forbid:
                found.append(
                    f"no_reference: line {line}: calls .{node.attr}, which this task forbids (it is the reference's op)"
                )
            elif node.attr in BANNED_ATTRS or node.attr.startswith("_"):
                found.append(f"no_harness_access: line {line}: touches .{node.attr}")
            if isinstance(node.ctx, ast.Store | ast.Del):
                found.append(
                    f"no_state: line {line}: assigns the attribute .{node.attr} (monkeypatching or state kept across calls)"
                )
        elif isinstance(node, ast.Global | ast.Nonlocal):
            found.append(f"no_state: line {line}: `{type(node).__name__.lower()}` statement")
        elif isinstance(node, ast.ClassDef):
            found.append(
                f"no_harness_access: line {line}: defines a class (tensor subclasses and lazy objects are refused)"
            )
        elif isinstance(node, ast.Try | ast.TryStar):
            found.append(
                f"no_harness_access: line {line}: try/except (a kernel that fails must fail, not return zeros)"
            )
        elif isinstance(
            node, ast.Yield | ast.YieldFrom | ast.Await | ast.AsyncFunctionDef | ast.AsyncWith
        ):
            found.append(f"no_harness_access: line {line}: generators and async code are refused")
        elif isinstance(node, ast.With):
            for w in node.items:
                fn = w.context_expr.func if isinstance(w.context_expr, ast.Call) else None
                name = (
                    fn.attr
                    if isinstance(fn, ast.Attribute)
                    else fn.id
                    if isinstance(fn, ast.Name)
                    else None
                )
                if name not in WITH_ALLOWED:
                    found.append(
                        f"no_harness_access: line {line}: `with` is allowed for torch.no_grad() only"
                    )
        elif isinstance(node, ast.FunctionDef | ast.Lambda):
            defaults = [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
            if not all(_immutable_literal(d) for d in defaults):
                found.append(
                    f"no_state: line {line}: a default argument that is not a constant (a cache across calls)"
                )
            if isinstance(node, ast.FunctionDef) and node.decorator_list and node not in tree.body:
                found.append(f"no_state: line {line}: decorators are refused")
    return list(dict.fromkeys(found))


def _called_names(fn: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _reachability(tree: ast.Module) -> list[str]:
    """Every function defined at the top level must be reached from `kernel`."""
    fns = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    seen, todo = {"kernel"}, ["kernel"]
    while todo:
        for name in _called_names(fns[todo.pop()]) & set(fns):
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return [
        f"reachable: `{name}` is defined but kernel never calls it (the kernel must be the code that runs)"
        for name in fns
        if name not in seen
    ]


def _callee(call: ast.Call) -> str | None:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def _is_alias(expr: ast.AST | None, aliases: set[str]) -> bool:
    """The expression is an input handed back: a name bound to one, or a passthrough of one."""
    while True:
        if isinstance(expr, ast.Name):
            return expr.id in aliases
        if isinstance(expr, ast.Subscript) and _full_slice(expr.slice):
            expr = expr.value
            continue
        if isinstance(expr, ast.Call) and _callee(expr) in PASSTHROUGH:
            func = expr.func
            if isinstance(func, ast.Attribute) and not (
                isinstance(func.value, ast.Name) and func.value.id in {"torch", "np", "numpy"}
            ):
                expr = func.value
            elif expr.args:
                expr = expr.args[0]
            else:
                return False
            continue
        return False


def _full_slice(s: ast.AST) -> bool:
    parts = s.elts if isinstance(s, ast.Tuple) else [s]
    return all(
        (isinstance(p, ast.Slice) and p.lower is None and p.upper is None and p.step is None)
        or (isinstance(p, ast.Constant) and p.value is Ellipsis)
        for p in parts
    )


def _noop_or_identity(kernel: ast.FunctionDef) -> list[str]:
    params = {a.arg for a in [*kernel.args.posonlyargs, *kernel.args.args]}
    assigned: dict[str, list[ast.AST]] = {}
    written: set[str] = set()
    for node in ast.walk(kernel):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    assigned.setdefault(t.id, []).append(node.value)
                elif isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
                    written.add(t.value.id)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign | ast.For) and isinstance(
            node.target, ast.Name
        ):
            written.add(node.target.id)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr.endswith("_")
            and isinstance(node.func.value, ast.Name)
        ):
            written.add(node.func.value.id)  # in-place op such as out.add_(...)
        elif isinstance(node, ast.Call):
            for kw in node.keywords:  # out=buffer
                if kw.arg == "out" and isinstance(kw.value, ast.Name):
                    written.add(kw.value.id)
    aliases = set(params)
    changed = True
    while changed:  # names bound only to inputs (or views and copies of them)
        changed = False
        for name, values in assigned.items():
            if (
                name not in aliases
                and name not in written
                and all(_is_alias(v, aliases) for v in values)
            ):
                aliases.add(name)
                changed = True
    blank = {
        name
        for name, values in assigned.items()
        if name not in written
        and all(isinstance(v, ast.Call) and _callee(v) in BLANK for v in values)
    }
    returns = [n for n in ast.walk(kernel) if isinstance(n, ast.Return)]
    if not any(r.value is not None for r in returns):
        return ["not_noop_or_identity: kernel returns nothing (a no-op)"]
    kinds = set()
    for r in returns:
        v = r.value
        if v is None or isinstance(v, ast.Constant) or _immutable_literal(v):
            kinds.add("a constant (a no-op)")
        elif _is_alias(v, aliases):
            kinds.add("an input unchanged (an identity kernel)")
        elif (isinstance(v, ast.Call) and _callee(v) in BLANK) or (
            isinstance(v, ast.Name) and v.id in blank
        ):
            kinds.add("a buffer it never computes (a no-op)")
        else:
            return []
    return [f"not_noop_or_identity: kernel returns {k}" for k in sorted(kinds)]


class _Normalize(ast.NodeTransformer):
    """Names renamed by first appearance, docstrings dropped: a renamed copy looks the same."""

    def __init__(self, keep: Iterable[str]) -> None:
        self.keep = set(keep)
        self.names: dict[str, str] = {}

    def _rename(self, name: str) -> str:
        if name in self.keep:
            return name
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.copy_location(ast.Name(self._rename(node.id), node.ctx), node)

    def visit_arg(self, node: ast.arg) -> ast.AST:
        return ast.copy_location(ast.arg(self._rename(node.arg)), node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.name = "f"
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            node.body = body[1:] or [ast.Pass()]
        self.generic_visit(node)
        return node


def _tokens(fn: ast.FunctionDef, module: ast.Module | None = None) -> list[str]:
    keep = {
        "torch",
        "F",
        "np",
        "numpy",
        "math",
        "range",
        "len",
        "float",
        "int",
        "min",
        "max",
        "abs",
        "sum",
    }
    fns = [fn]
    if module is not None:  # the kernel's helpers count as its code (a copy split in two)
        fns += [n for n in module.body if isinstance(n, ast.FunctionDef) and n is not fn]
    text = "\n".join(ast.unparse(_Normalize(keep).visit(ast.parse(ast.unparse(f)))) for f in fns)
    toks = tokenize.generate_tokens(io.StringIO(text).readline)
    skip = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    return [t.string for t in toks if t.type not in skip]


def _near_copy(kernel: ast.FunctionDef, ref: ast.FunctionDef, module: ast.Module) -> list[str]:
    a, b = _tokens(ref), _tokens(kernel, module)
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    coverage = sum(block.size for block in sm.get_matching_blocks()) / max(1, len(a))
    if sm.ratio() >= COPY_RATIO or coverage >= COPY_COVERAGE:
        return [
            f"not_a_copy: kernel is the reference's code (similarity {sm.ratio():.2f}, {coverage:.0%} of its tokens)"
        ]
    return []
