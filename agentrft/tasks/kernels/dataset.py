"""Kernel-writing tasks (stage: data): a YAML list of reference PyTorch functions -> rows.

Each task is a reference function the model must reimplement faster as `kernel(...)`:

    tasks:
    - name: softmax_rows                    # identifier, unique
      split: val                            # train (default) or val
      reference: |                          # defines `reference`; torch, F, np, math are in scope
        def reference(x):
            m = x.max(dim=-1, keepdim=True).values
            e = torch.exp(x - m)
            return e / e.sum(dim=-1, keepdim=True)
      args:                                 # one entry per parameter, in order
        x: {shape: [N, D], dtype: float32}  # a tensor; sizes by name or number
        # {shape: [N], dtype: int64, dist: randint, low: 0, high: 10}  dist: normal (default),
        #   uniform (low, high), positive (|normal| + 0.1), randint (low, high), bool (p)
        # {size: D}        a Python int: that case's size D
        # {value: 1e-5}    a fixed Python number
      cases: [{N: 4, D: 33}, {N: 1, D: 1}]  # correctness inputs, one per case (odd shapes too)
      timing: {N: 512, D: 1024}             # the input timed for the speedup
      forbid: [softmax]                     # ops the kernel may not call (the reference's op)
      tolerance: {rtol: 1e-4, atol: 1e-5}   # optional; default per output dtype (TOLERANCES)

`load_tasks` validates every task when it loads: the reference parses and defines
`reference` with the args' names, every case and the timing input build, and the reference
runs on them and returns one tensor, the same twice. A task that cannot run is a
ConfigError naming the file, the task's line and the fix.

A row is `{"messages": [{"role": "user", "content": PROMPT}], "task", "reference", "args",
"cases", "timing", "forbid", "tolerance", "seed"}`: everything a grader needs to rebuild the
inputs (`build_inputs`, seeded) and check a kernel, and nothing of the expected outputs.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrft.errors import ConfigError

# default tolerances by output dtype: (rtol, atol), as in torch.testing.assert_close
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1.3e-4, 1e-5),
    "float16": (1e-3, 1e-3),
    "bfloat16": (1.6e-2, 1e-2),
}
DTYPES = (*TOLERANCES, "int64", "int32", "bool")
DISTS = ("normal", "uniform", "positive", "randint", "bool")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")
DEFAULT_SEED = 1234
DEFAULT_TASKS = Path(__file__).resolve().parent / "tasks.yaml"


@dataclass(frozen=True)
class KernelTask:
    name: str
    reference: str
    args: dict[str, dict[str, Any]]
    cases: list[dict[str, int]]
    timing: dict[str, int]
    split: str = "train"
    forbid: list[str] = field(default_factory=list)
    tolerance: dict[str, float] | None = None
    where: str = ""  # file:line of the task, for messages

    def item(self, seed: int = DEFAULT_SEED) -> dict[str, Any]:
        """The row fields a grader reads."""
        return {
            "task": self.name,
            "reference": self.reference,
            "args": self.args,
            "cases": self.cases,
            "timing": self.timing,
            "forbid": self.forbid,
            "tolerance": self.tolerance,
            "seed": seed,
        }


# -- inputs --------------------------------------------------------------------------------
def build_inputs(
    args: Mapping[str, Mapping[str, Any]], sizes: Mapping[str, int], seed: int
) -> list[Any]:
    """The arguments for one case: tensors drawn from a torch.Generator seeded with `seed`."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    values: list[Any] = []
    for name, spec in args.items():
        if "value" in spec:
            values.append(spec["value"])
            continue
        if "size" in spec:
            values.append(int(_size(spec["size"], sizes, name)))
            continue
        shape = tuple(_size(s, sizes, name) for s in spec.get("shape", []))
        dtype = getattr(torch, str(spec.get("dtype", "float32")))
        dist = spec.get(
            "dist", "randint" if not dtype.is_floating_point and dtype != torch.bool else "normal"
        )
        if dtype == torch.bool or dist == "bool":
            t = torch.rand(shape, generator=gen) < float(spec.get("p", 0.5))
            values.append(t.to(dtype))
        elif dist == "randint":
            t = torch.randint(
                int(spec.get("low", 0)), int(spec.get("high", 10)), shape, generator=gen
            )
            values.append(t.to(dtype))
        else:
            t = torch.randn(shape, generator=gen, dtype=torch.float64)
            if dist == "uniform":
                lo, hi = float(spec.get("low", 0.0)), float(spec.get("high", 1.0))
                t = torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo
            elif dist == "positive":
                t = t.abs() + 0.1
            else:
                t = t * float(spec.get("scale", 1.0))
            values.append(t.to(dtype))
    return values


def _size(s: Any, sizes: Mapping[str, int], arg: str) -> int:
    if isinstance(s, int):
        return s
    if s not in sizes:
        raise KeyError(f"argument {arg!r} needs size {s!r}, which the case does not give")
    return int(sizes[s])


def reference_function(source: str) -> Any:
    """`reference` from its source, with torch, F, np and math in scope (trusted code: the
    task list's, never the model's)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    ns: dict[str, Any] = {"torch": torch, "F": F, "np": np, "math": math, "__name__": "reference"}
    exec(compile(source, "<reference>", "exec"), ns)
    return ns["reference"]


def tolerance_for(dtype: str, override: Mapping[str, float] | None) -> tuple[float, float]:
    rtol, atol = TOLERANCES.get(dtype, (0.0, 0.0))
    if override:
        rtol, atol = float(override.get("rtol", rtol)), float(override.get("atol", atol))
    return rtol, atol


# -- loading and validation ----------------------------------------------------------------
def load_tasks(path: str | Path, *, run: bool = True) -> list[KernelTask]:
    """Every task of a task file, validated (and, with `run`, run on all its inputs)."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the task file ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), list) or not data["tasks"]:
        raise ConfigError(
            f"{path}: expected `tasks:` followed by a list of tasks (see agentrft.tasks.kernels.dataset)"
        )
    nodes = next(v for k, v in root.value if k.value == "tasks").value  # type: ignore[union-attr]
    tasks: list[KernelTask] = []
    seen: dict[str, str] = {}
    for raw, node in zip(data["tasks"], nodes, strict=True):
        where = f"{path}:{node.start_mark.line + 1}"
        task = parse_task(raw, where)
        if task.name in seen:
            raise ConfigError(
                f"{where}: task name {task.name!r} is already used at {seen[task.name]}; names are unique"
            )
        seen[task.name] = where
        if run:
            check_task(task)
        tasks.append(task)
    return tasks


def parse_task(raw: Any, where: str) -> KernelTask:
    """One task's fields, checked without running anything."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: a task is a mapping with name, reference, args, cases, timing")
    known = {"name", "split", "reference", "args", "cases", "timing", "forbid", "tolerance"}
    if extra := sorted(set(raw) - known):
        raise ConfigError(f"{where}: unknown key(s) {extra}; a task has {sorted(known)}")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(
            f"{where}: `name` must be an identifier such as softmax_rows, got {name!r}"
        )
    where = f"{where} (task {name!r})"
    missing = [k for k in ("reference", "args", "cases", "timing") if k not in raw]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}")
    split = raw.get("split", "train")
    if split not in ("train", "val"):
        raise ConfigError(f"{where}: `split` is train or val, got {split!r}")
    source = raw["reference"]
    if not isinstance(source, str):
        raise ConfigError(f"{where}: `reference` is Python source defining `def reference(...)`")
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ConfigError(
            f"{where}: the reference is not valid Python (its line {exc.lineno}: {exc.msg})"
        ) from None
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "reference"]
    if not fns:
        raise ConfigError(f"{where}: the reference must define a top-level `def reference(...)`")
    args = raw["args"]
    if not isinstance(args, dict) or not args:
        raise ConfigError(f"{where}: `args` maps each parameter name to its input spec")
    params = [a.arg for a in fns[0].args.args]
    if params != list(args):
        raise ConfigError(
            f"{where}: `args` names {list(args)} but reference takes {params}; list them in the same order"
        )
    for arg, spec in args.items():
        _check_arg(spec, f"{where}: args.{arg}")
    cases, timing = raw["cases"], raw["timing"]
    if not isinstance(cases, list) or not cases or not all(isinstance(c, dict) for c in cases):
        raise ConfigError(
            f"{where}: `cases` is a non-empty list of sizes such as [{{N: 4, D: 33}}]"
        )
    if not isinstance(timing, dict):
        raise ConfigError(f"{where}: `timing` is one mapping of sizes such as {{N: 512, D: 1024}}")
    forbid = raw.get("forbid", [])
    if not isinstance(forbid, list) or not all(
        isinstance(f, str) and _NAME.match(f) for f in forbid
    ):
        raise ConfigError(f"{where}: `forbid` is a list of op names such as [softmax]")
    tol = raw.get("tolerance")
    if tol is not None and (not isinstance(tol, dict) or set(tol) - {"rtol", "atol"}):
        raise ConfigError(f"{where}: `tolerance` is {{rtol: ..., atol: ...}}")
    return KernelTask(
        name,
        source,
        {k: dict(v) for k, v in args.items()},
        [dict(c) for c in cases],
        dict(timing),
        split,
        list(forbid),
        {k: float(v) for k, v in tol.items()} if tol else None,
        where,
    )


def _check_arg(spec: Any, where: str) -> None:
    if not isinstance(spec, dict):
        raise ConfigError(
            f"{where}: an input spec is a mapping: {{shape: [N], dtype: float32}}, {{size: N}} or {{value: 1}}"
        )
    if "value" in spec or "size" in spec:
        return
    if not isinstance(spec.get("shape"), list):
        raise ConfigError(f"{where}: a tensor needs `shape`, a list of sizes (names or numbers)")
    if str(spec.get("dtype", "float32")) not in DTYPES:
        raise ConfigError(f"{where}: dtype {spec.get('dtype')!r} is not one of {', '.join(DTYPES)}")
    if spec.get("dist", "normal") not in DISTS:
        raise ConfigError(f"{where}: dist {spec.get('dist')!r} is not one of {', '.join(DISTS)}")


def check_task(task: KernelTask, seed: int = DEFAULT_SEED) -> None:
    """Build every input and run the reference on it; ConfigError naming the task otherwise."""
    import torch

    try:
        ref = reference_function(task.reference)
    except Exception as exc:
        raise ConfigError(
            f"{task.where}: the reference fails to load: {type(exc).__name__}: {exc}"
        ) from None
    for i, sizes in enumerate([*task.cases, task.timing]):
        label = f"cases[{i}] {sizes}" if i < len(task.cases) else f"timing {sizes}"
        try:
            inputs = build_inputs(task.args, sizes, seed + i)
        except (KeyError, ValueError, TypeError, RuntimeError) as exc:
            raise ConfigError(f"{task.where}: {label}: the inputs do not build: {exc}") from None
        try:
            with torch.no_grad():
                first = ref(*inputs)
                second = ref(*build_inputs(task.args, sizes, seed + i))
        except Exception as exc:
            raise ConfigError(
                f"{task.where}: {label}: the reference raises {type(exc).__name__}: {exc}"
            ) from None
        if type(first) is not torch.Tensor:
            raise ConfigError(
                f"{task.where}: {label}: the reference must return one torch.Tensor, got {type(first).__name__}"
            )
        if not torch.equal(first, second):
            raise ConfigError(
                f"{task.where}: {label}: the reference is not deterministic (two runs differ)"
            )


# -- rows ----------------------------------------------------------------------------------
def describe_args(task: KernelTask) -> str:
    """The inputs in words, for the prompt."""
    lines = []
    for name, spec in task.args.items():
        if "value" in spec:
            lines.append(f"- {name}: the number {spec['value']!r}")
        elif "size" in spec:
            lines.append(f"- {name}: an int (the size {spec['size']})")
        else:
            shape = ", ".join(str(s) for s in spec["shape"])
            lines.append(f"- {name}: a {spec.get('dtype', 'float32')} tensor of shape ({shape})")
    return "\n".join(lines)


def prompt(task: KernelTask) -> str:
    params = ", ".join(task.args)
    sizes = ", ".join(f"{k}={v}" for k, v in task.timing.items())
    banned = f" Do not call {', '.join(task.forbid)}." if task.forbid else ""
    return (
        f"Task: {task.name}\nReference implementation:\n```python\n{task.reference.rstrip()}\n```\n"
        f"Inputs:\n{describe_args(task)}\n"
        f"Write a faster `kernel({params})` in PyTorch that returns the same result "
        f"(timed at {sizes}). Do not call `reference`.{banned}"
    )


PREFILL_IMPORTS = "```python\nimport torch\nimport torch.nn.functional as F\n\n\n"


def signature_prefill(task: KernelTask) -> str:
    """The start of an answer up to the kernel's return expression (the easier variant: the
    model writes one expression; the gates are the same)."""
    return f"{PREFILL_IMPORTS}def kernel({', '.join(task.args)}):\n    return "


def task_row(task: KernelTask, seed: int = DEFAULT_SEED, prefill: bool = False) -> dict[str, Any]:
    row: dict[str, Any] = {"messages": [{"role": "user", "content": prompt(task)}]}
    if prefill:
        row["prefill"] = signature_prefill(task)
    return {**row, **task.item(seed)}


@dataclass(frozen=True)
class BuildReport:
    train: int
    val: int
    tasks: Sequence[KernelTask]

    def lines(self) -> list[str]:
        return [
            f"{len(self.tasks)} tasks, each validated (inputs built, reference run on every case)",
            f"train: {self.train} rows   val: {self.val} rows",
        ]


def build_dataset(
    tasks_path: str | Path, out: str | Path, seed: int = DEFAULT_SEED, prefill: bool = False
) -> BuildReport:
    """train.jsonl and val.jsonl (by each task's `split`) in `out`, from a task file. With
    `prefill`, each row's reply starts as its kernel's signature up to `return ` (the row's
    own `prefill`, for local models only: a chat endpoint takes no prefill)."""
    from agentrft.data.jsonl import write_jsonl

    tasks = load_tasks(tasks_path)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    train = [task_row(t, seed, prefill) for t in tasks if t.split == "train"]
    val = [task_row(t, seed, prefill) for t in tasks if t.split == "val"]
    write_jsonl(out / "train.jsonl", train)
    write_jsonl(out / "val.jsonl", val)
    return BuildReport(len(train), len(val), tasks)
