"""Build a repository-research dataset from a repository's own code (stage: data).

Questions whose answers are facts checkable in the code, read with Python's `ast` from the
`.py` files of one revision (through git, no checkout):

    where_defined  Where is `X` defined?                     fact: the file's path
    returns        What type does `F` return?                fact: its return annotation
    raises         Which exceptions does `F` raise itself?   facts: the classes its own `raise`s name
    docstring      Which function's docstring begins "..."?  fact: the function's name
    default        What is the default of parameter P of F?  fact: the default, as written
    imports        Which files import module `Z`?            facts: their paths (1 to 3 files)

Row: {"messages": [*WORKED_EXAMPLES, {"role": "user", "content": QUESTION}],
      "prefill": FIRST_CALL_START, "facts": [...], "kind": KIND, "subject": NAME,
      "source_files": [paths the answer comes from], "repo": ABS_PATH, "commit": SHA}

Split by file: each `.py` file goes to validation or to training by a stable hash of its
path, and a question goes where all its `source_files` go (a question spanning both is
dropped). So held-out questions are about code that no training question covers.

Worked examples (`worked_examples`, default 2) are made from training rows, never written by
hand: the row's first tool call (`first_call`: a grep for the definition, the docstring or the
import) run on the revision, its real output, and an answer that states the row's facts.
Only rows whose first call's output shows every fact become examples, or, for `raises` and
`docstring`, rows whose first call finds one line and a short read_file from there shows every
fact (a two-call example); they leave the training rows. Each row's `prefill` starts the reply with its own first call, all but the closing braces.

A user's own questions (`load_qa_rows`): any JSONL of rows with `messages` and `facts`, in
agentrft's dataset format; a bad row is refused naming its file and line.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import shutil
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrft.data.jsonl import load_dataset, write_jsonl
from agentrft.errors import ConfigError
from agentrft.tasks.file_selection.dataset import PathFilter, _git, repo_root
from agentrft.tools.code_search import read_tree

DEFAULT_VAL_FRACTION = 0.25
DEFAULT_WORKED_EXAMPLES = 2
DEFAULT_PER_FILE = 2  # questions of each kind per file, at most
MAX_FACT_CHARS = 40  # longer defaults and annotations are not short facts
MAX_IMPORTERS = 3
MIN_DOC_WORDS = 5
EXAMPLE_MAX_OUTPUT_LINES = 6  # a worked example's tool output stays short: every prompt carries it
EXAMPLE_MAX_READ_LINES = 12  # and so does the read_file of a two-call example
_GREP_LINE = re.compile(r"^([^:\n]+):(\d+): ")  # path:line: text, one grep match
KINDS = ("where_defined", "returns", "raises", "docstring", "default", "imports")
_LINES = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")  # lines as Python's tokenizer counts them
GUESSABLE = frozenset(
    {
        "None",
        "True",
        "False",
        "0",
        "1",
        "()",
        "[]",
        "{}",
        "''",
        '""',
        "-1",
        "bool",
        "str",
        "int",
        "float",
        "Any",
    }
)

DROP_REASONS = {
    "syntax_error": "files that do not parse as Python (no questions from them)",
    "ambiguous_name": "names defined more than once in the repository (a where/return/raise/default question would have two answers)",
    "guessable": "defaults or return types a model could guess without looking (None, True, 0, ...)",
    "long_fact": f"facts over {MAX_FACT_CHARS} characters",
    "duplicate_docstring": "docstring first lines shared by two functions",
    "too_many_importers": f"modules imported by more than {MAX_IMPORTERS} files",
    "per_file_cap": f"questions over the cap of {DEFAULT_PER_FILE} per kind and file",
    "spans_split": "questions whose answer spans a training file and a held-out file",
}

SYSTEM_HINT = "Answer with the facts asked for, in one short sentence."


@dataclass(frozen=True)
class Definition:
    """A function, method or class of one file."""

    name: str  # the bare name
    qualname: str  # Class.method for methods
    path: str
    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def definitions(path: str, tree: ast.Module) -> list[Definition]:
    """Top-level functions and classes, and the methods of top-level classes."""
    out: list[Definition] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.append(Definition(node.name, node.name, path, node))
        if isinstance(node, ast.ClassDef):
            out += [
                Definition(m.name, f"{node.name}.{m.name}", path, m)
                for m in node.body
                if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)
            ]
    return [
        d
        for d in out
        if not (d.name.startswith("__") and d.name.endswith("__"))
        and not d.name.startswith("test_")
    ]


def own_raises(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """The exception classes named by `fn`'s own raise statements (not those of nested
    functions or classes; a bare `raise` names none), sorted."""
    names: set[str] = set()
    stack: list[ast.AST] = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name | ast.Attribute):
                names.add(ast.unparse(exc))
        stack.extend(ast.iter_child_nodes(node))
    return sorted(names)


def imported_modules(tree: ast.Module) -> set[str]:
    """The absolute module names `tree` imports (relative imports are left out)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
    return out


def _grep_call(pattern: str, files_only: bool = False) -> dict[str, Any]:
    args: dict[str, Any] = {"glob": "*.py"}
    if files_only:
        args["files_only"] = True
    args["pattern"] = pattern  # last: the call's text reads glob, then pattern
    return {"name": "grep", "arguments": args}


def def_pattern(name: str) -> str:
    return rf"def {re.escape(name)}\("


@dataclass
class Question:
    kind: str
    question: str
    facts: list[str]
    subject: str
    source_files: list[str]
    first_call: dict[str, Any]
    answer: str  # how a worked example answers it

    def row(self, repo: Path, commit: str) -> dict[str, Any]:
        return {
            "messages": [{"role": "user", "content": self.question}],
            "facts": self.facts,
            "kind": self.kind,
            "subject": self.subject,
            "source_files": self.source_files,
            "repo": str(repo),
            "commit": commit,
            "first_call": self.first_call,
            "answer": self.answer,
        }


@dataclass
class BuildReport:
    repo: Path
    commit: str = ""
    files: int = 0  # .py files read
    train: int = 0
    val: int = 0
    train_files: int = 0
    val_files: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    user_rows: int = 0

    @property
    def kept(self) -> int:
        return self.train + self.val

    def lines(self) -> list[str]:
        out = [
            f"{self.repo} at {self.commit[:12]}: {self.files} Python files read, {self.kept} questions kept "
            f"({self.train} train from {self.train_files} files, {self.val} validation from {self.val_files} other files)"
        ]
        if self.user_rows:
            out.append(f"  {self.user_rows} of them are your own questions")
        if self.kinds:
            out.append(
                "  kept by kind: "
                + ", ".join(f"{k} {self.kinds[k]}" for k in KINDS if self.kinds[k])
            )
        for reason, text in DROP_REASONS.items():
            if self.dropped[reason]:
                out.append(f"  dropped {self.dropped[reason]:>6}  {text}")
        if self.examples:
            out.append(
                f"  {len(self.examples)} training questions became the worked examples at the start of every row: {'; '.join(self.examples)}"
            )
        return out


def questions_from_code(
    sources: dict[str, str],
    report: BuildReport,
    per_file: int = DEFAULT_PER_FILE,
    kinds: Iterable[str] = KINDS,
) -> list[Question]:
    """Every question of `kinds` the code supports, in a stable order, after the drop rules."""
    wanted = set(kinds)
    trees: dict[str, ast.Module] = {}
    for path in sorted(sources):
        try:
            trees[path] = ast.parse(sources[path], filename=path)
        except (SyntaxError, ValueError):
            report.dropped["syntax_error"] += 1
    defs = [d for path, tree in trees.items() for d in definitions(path, tree)]

    lines = {
        path: [line.encode("utf-8") for line in _LINES.findall(sources[path])] for path in trees
    }

    def written(node: ast.expr, path: str) -> str:
        """The code of `node` as written in its file (quotes kept, whitespace runs as one
        space); ast.get_source_segment, without splitting the file again for every node."""
        first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
        rows = lines[path][first : last + 1]
        if not rows or node.end_col_offset is None:
            return ast.unparse(node)
        if len(rows) == 1:
            text = rows[0][node.col_offset : node.end_col_offset]
        else:
            text = (
                rows[0][node.col_offset :] + b"".join(rows[1:-1]) + rows[-1][: node.end_col_offset]
            )
        return " ".join(text.decode("utf-8", errors="replace").split())

    by_name: dict[str, list[Definition]] = defaultdict(list)
    for d in defs:
        by_name[d.name].append(d)
    docs: dict[str, list[Definition]] = defaultdict(list)
    for d in defs:
        doc = ast.get_docstring(d.node, clean=True)
        if doc and isinstance(d.node, ast.FunctionDef | ast.AsyncFunctionDef):
            docs[doc.strip().splitlines()[0].strip()].append(d)

    out: list[Question] = []
    taken: Counter[tuple[str, str]] = Counter()

    def add(q: Question) -> None:
        if q.kind not in wanted:
            return
        key = (q.kind, q.source_files[0])
        if taken[key] >= per_file:
            report.dropped["per_file_cap"] += 1
            return
        taken[key] += 1
        out.append(q)

    def short(fact: str) -> bool:
        if fact in GUESSABLE:
            report.dropped["guessable"] += 1
            return False
        if len(fact) > MAX_FACT_CHARS:
            report.dropped["long_fact"] += 1
            return False
        return True

    for d in defs:
        if len(by_name[d.name]) > 1:
            report.dropped["ambiguous_name"] += 1
            continue
        what = (
            "class"
            if isinstance(d.node, ast.ClassDef)
            else ("method" if "." in d.qualname else "function")
        )
        add(
            Question(
                "where_defined",
                f"In which file is the {what} `{d.qualname}` defined?",
                [d.path],
                d.name,
                [d.path],
                _grep_call(rf"(def|class) {re.escape(d.name)}\b"),
                f"`{d.qualname}` is defined in {d.path}.",
            )
        )
        if isinstance(d.node, ast.ClassDef):
            continue
        fn = d.node
        if fn.returns is not None and short(ret := written(fn.returns, d.path)):
            add(
                Question(
                    "returns",
                    f"What type does `{d.qualname}` return?",
                    [ret],
                    d.name,
                    [d.path],
                    _grep_call(def_pattern(d.name)),
                    f"`{d.qualname}` returns {ret}.",
                )
            )
        raised = own_raises(fn)
        if raised:
            add(
                Question(
                    "raises",
                    f"Which exceptions does `{d.qualname}` raise in its own body?",
                    raised,
                    d.name,
                    [d.path],
                    _grep_call(def_pattern(d.name)),
                    f"`{d.qualname}` raises {', '.join(raised)}.",
                )
            )
        args = fn.args
        positional = [*args.posonlyargs, *args.args]
        pairs = list(
            zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True)
        )
        pairs += [
            (a, dflt)
            for a, dflt in zip(args.kwonlyargs, args.kw_defaults, strict=True)
            if dflt is not None
        ]
        for arg, dflt in pairs:
            value = written(dflt, d.path)
            if short(value):
                add(
                    Question(
                        "default",
                        f"What is the default value of parameter `{arg.arg}` of `{d.qualname}`?",
                        [value],
                        d.name,
                        [d.path],
                        _grep_call(def_pattern(d.name)),
                        f"The default of `{arg.arg}` is {value}.",
                    )
                )
    for first_line, owners in sorted(docs.items()):
        if len(owners) > 1:
            report.dropped["duplicate_docstring"] += 1
            continue
        d = owners[0]
        if len(first_line.split()) < MIN_DOC_WORDS or len(by_name[d.name]) > 1:
            continue
        add(
            Question(
                "docstring",
                f"Which function's docstring begins: \"{first_line}\"? Answer with the function's name.",
                [d.name],
                d.name,
                [d.path],
                _grep_call(re.escape(first_line[:60])),
                f"The function is `{d.qualname}`.",
            )
        )
    importers: dict[str, list[str]] = defaultdict(list)
    for path, tree in trees.items():
        for module in imported_modules(tree):
            importers[module].append(path)
    for module, paths in sorted(importers.items()):
        if len(paths) > MAX_IMPORTERS:
            report.dropped["too_many_importers"] += 1
            continue
        paths = sorted(paths)
        add(
            Question(
                "imports",
                f"Which files of the repository import the module `{module}`? Answer with their paths.",
                paths,
                module,
                paths,
                _grep_call(rf"^\s*(from|import)\s+{re.escape(module)}\b", files_only=True),
                "Imported by: " + ", ".join(paths) + ".",
            )
        )
    return out


def is_held_out(path: str, val_fraction: float) -> bool:
    """Whether file `path` belongs to validation: a stable hash of the path, the same on every
    machine and for every revision."""
    h = int.from_bytes(hashlib.sha256(path.encode("utf-8")).digest()[:8], "big")
    return h / 2**64 < val_fraction


def split_by_file(
    questions: Sequence[Question], val_fraction: float, report: BuildReport
) -> tuple[list[Question], list[Question]]:
    train: list[Question] = []
    val: list[Question] = []
    for q in questions:
        sides = {is_held_out(p, val_fraction) for p in q.source_files}
        if len(sides) > 1:
            report.dropped["spans_split"] += 1
            continue
        (val if sides.pop() else train).append(q)
    return train, val


# -- worked examples and prefills ------------------------------------------------------------
def call_text(call: dict[str, Any]) -> str:
    return "<tool_call>" + json.dumps(call, ensure_ascii=False) + "</tool_call>"


def call_prefill(call: dict[str, Any]) -> str:
    """The call's text up to its closing braces: every argument is written, and the model
    closes the call (`}}`) or adds an argument first. (Leaving the pattern itself open was
    measured worse: the 135M model went on writing it, into noise, a broken regular
    expression or the turn's token limit.)"""
    text = call_text(call)
    return text[: text.rindex("}}")]


def second_call(kind: str, shown: str) -> list[tuple[dict[str, Any], int, int]]:
    """Candidate read_file calls that follow a first grep showing one match: for `raises`, the
    function from its `def` line on; for `docstring`, the lines above the docstring, where the
    `def` is. Each is (call, start_line, end_line), shortest first."""
    first = shown.splitlines()
    if kind not in ("raises", "docstring") or len(first) != 1:
        return []
    match = _GREP_LINE.match(first[0])
    if match is None:
        return []
    path, line = match.group(1), int(match.group(2))
    if kind == "raises":
        spans = [(line, line + k) for k in range(2, EXAMPLE_MAX_READ_LINES)]
    else:
        spans = [(max(1, line - k), line) for k in (1, 2, 3)]
    return [
        ({"name": "read_file", "arguments": {"path": path, "start_line": a, "end_line": b}}, a, b)
        for a, b in spans
    ]


def pick_worked_examples(
    train: list[dict[str, Any]], n: int, root: Path
) -> tuple[list[dict[str, Any]], list[int]]:
    """Up to `n` worked examples of different kinds from the training rows whose first call's
    real output is short and shows every fact, or, for `raises` and `docstring`, whose first
    call finds one line and a short read_file after it shows every fact (a two-call example),
    and their positions in `train`."""
    # the tools load only when examples are made
    from agentrft.graders.fact_recall import fact_found
    from agentrft.tools.repo_workspace import create_workspace

    if n <= 0 or not train:
        return [], []
    ws = create_workspace(str(root), train[0]["commit"], "repo-qa-examples", "commit")
    try:
        found: list[tuple[int, list[tuple[dict[str, Any], str]]]] = []
        kinds: set[str] = set()
        files: set[str] = set()
        # one-call examples first: a two-call one only fills a kind no one-call example covers
        for two_calls in (False, True):
            for i, row in enumerate(train):
                if len(found) == n:
                    break
                if row["kind"] in kinds or files & set(row["source_files"]):
                    continue  # one example per kind and per file, or the model learns to repeat one answer
                if (steps := _example_steps(ws, row, two_calls, fact_found)) is None:
                    continue
                found.append((i, steps))
                kinds.add(row["kind"])
                files.update(row["source_files"])
        messages: list[dict[str, Any]] = []
        for i, steps in sorted(found):
            messages.append({"role": "user", "content": train[i]["messages"][-1]["content"]})
            for call, output in steps:
                messages += [
                    {"role": "assistant", "content": call_text(call)},
                    {"role": "tool", "content": output},
                ]
            messages.append({"role": "assistant", "content": train[i]["answer"]})
        return messages, sorted(i for i, _ in found)
    finally:
        shutil.rmtree(ws, ignore_errors=True)


def _example_steps(
    ws: Path, row: dict[str, Any], two_calls: bool, fact_found: Callable[[str, str], bool]
) -> list[tuple[dict[str, Any], str]] | None:
    """The calls and real outputs of a worked example of `row` whose outputs show every fact:
    its first call alone, or (`two_calls`) followed by a short read_file; None if neither."""
    from agentrft.tools.repo_workspace import grep_in, read_file_in

    args = row["first_call"]["arguments"]
    shown = grep_in(
        ws, args["pattern"], glob=args.get("glob"), files_only=bool(args.get("files_only"))
    )
    if len(shown.splitlines()) > EXAMPLE_MAX_OUTPUT_LINES:
        return None
    if all(fact_found(f, shown) for f in row["facts"]):
        return None if two_calls else [(row["first_call"], shown)]
    if two_calls:
        for call, a, b in second_call(row["kind"], shown):
            read = read_file_in(ws, call["arguments"]["path"], a, b)
            if all(fact_found(f, read) for f in row["facts"]):
                return [(row["first_call"], shown), (call, read)]
    return None


# -- a user's own questions ------------------------------------------------------------------
def load_qa_rows(path: str | Path) -> list[dict[str, Any]]:
    """A user's QA rows (agentrft's dataset format plus `facts`: a non-empty list of non-empty
    strings), every problem named by file and line."""
    items = load_dataset(path)
    problems: list[str] = []
    rows: list[dict[str, Any]] = []
    for item in items:
        facts = item.fields.get("facts")
        if (
            not isinstance(facts, list)
            or not facts
            or not all(isinstance(f, str) and f.strip() for f in facts)
        ):
            problems.append(
                f'{item.source}: "facts" must be a non-empty list of non-empty strings, e.g. ["agentrft/job.py", "load_job"] -> list what a correct answer must state'
            )
            continue
        sources = item.fields.get("source_files", [])
        if not isinstance(sources, list) or not all(isinstance(p, str) for p in sources):
            problems.append(f'{item.source}: "source_files" must be a list of paths')
            continue
        row = {"messages": [dict(m) for m in item.messages], **dict(item.fields)}
        if item.prefill is not None:
            row["prefill"] = item.prefill
        rows.append(row)
    if problems:
        raise ConfigError(
            problems[0]
            if len(problems) == 1
            else f"{path}: {len(problems)} bad row(s)\n  " + "\n  ".join(problems[:20])
        )
    return rows


def _user_side(row: dict[str, Any], val_fraction: float) -> bool | None:
    """Validation (True), training (False) or spanning both (None) for a user's row: by its
    `source_files` when it names them, else by a stable hash of its question."""
    paths = row.get("source_files") or [row["messages"][-1]["content"]]
    sides = {is_held_out(p, val_fraction) for p in paths}
    return sides.pop() if len(sides) == 1 else None


# -- the build ---------------------------------------------------------------------------------
def build_dataset(
    repo: str | Path,
    out_dir: str | Path,
    *,
    rev: str = "HEAD",
    val_fraction: float = DEFAULT_VAL_FRACTION,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    kinds: Iterable[str] = KINDS,
    per_file: int = DEFAULT_PER_FILE,
    worked_examples: int = DEFAULT_WORKED_EXAMPLES,
    user_questions: str | Path | None = None,
    prefill_first_call: bool = True,
) -> BuildReport:
    """Read the `.py` files of `repo` at `rev`, write `out_dir/train.jsonl` and
    `out_dir/val.jsonl`, and return what was kept and why the rest was dropped."""
    if not 0 < val_fraction < 1:
        raise ConfigError(f"val_fraction must be between 0 and 1, got {val_fraction}")
    wanted = set(kinds)
    if unknown := wanted - set(KINDS):
        raise ConfigError(
            f"unknown question kind(s) {sorted(unknown)} -> choose from {', '.join(KINDS)}"
        )
    root = repo_root(repo)
    commit = _git(root, "rev-parse", "--verify", f"{rev}^{{commit}}").decode().strip()
    report = BuildReport(root, commit)
    path_filter = PathFilter(include, exclude)
    tree = read_tree(root, commit)
    sources = {
        p: t for p, t in tree.items() if p.endswith(".py") and t is not None and path_filter.keep(p)
    }
    report.files = len(sources)
    questions = questions_from_code(sources, report, per_file, wanted)
    train_q, val_q = split_by_file(questions, val_fraction, report)
    # Kinds and files mixed in a stable order, so any first N rows (a pre-flight's) are a fair sample.
    train_q.sort(key=lambda q: hashlib.sha256(q.question.encode("utf-8")).digest())
    val_q.sort(key=lambda q: hashlib.sha256(q.question.encode("utf-8")).digest())
    train = [q.row(root, commit) for q in train_q]
    val = [q.row(root, commit) for q in val_q]
    if user_questions is not None:
        own = load_qa_rows(user_questions)
        report.user_rows = len(own)
        for row in own:
            row.setdefault("repo", str(root))
            row.setdefault("commit", commit)
            side = _user_side(row, val_fraction)
            if side is None:
                report.dropped["spans_split"] += 1
                continue
            (val if side else train).append(row)
    if worked_examples > 0:
        generated = [i for i, r in enumerate(train) if "first_call" in r]
        examples, used_local = pick_worked_examples(
            [train[i] for i in generated], worked_examples, root
        )
        used = {generated[i] for i in used_local}
        report.examples = [train[i]["messages"][-1]["content"] for i in sorted(used)]
        train = [row for i, row in enumerate(train) if i not in used]
        for row in [*train, *val]:
            row["messages"] = [*examples, *row["messages"]]
    for row in [*train, *val]:
        if prefill_first_call and "first_call" in row and "prefill" not in row:
            row["prefill"] = call_prefill(row["first_call"])
        row.pop("answer", None)  # only the worked examples state it
    report.kinds = Counter(r.get("kind", "yours") for r in [*train, *val])
    report.train, report.val = len(train), len(val)
    report.train_files = len({p for r in train for p in r.get("source_files", [])})
    report.val_files = len({p for r in val for p in r.get("source_files", [])})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "train.jsonl", train)
    write_jsonl(out / "val.jsonl", val)
    return report
