"""`agentrft data ...`: the dataset-building commands (stage: data).

agentrft data from-git REPO --out DIR [--max-files 8] [--val-fraction 0.2]
                                      [--include GLOB ...] [--exclude GLOB ...]
                                      [--worked-examples 2]
agentrft data repo-qa REPO --out DIR [--rev REV] [--val-fraction 0.25] [--include GLOB ...]
                                     [--questions OWN.jsonl] [--kind KIND ...]
agentrft data kernels --out DIR [--tasks TASKS.yaml] [--seed N] [--prefill-signature]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from agentrft.tasks.file_selection.dataset import (
    DEFAULT_MAX_FILES,
    DEFAULT_VAL_FRACTION,
    DEFAULT_WORKED_EXAMPLES,
)


def _print_report(lines: list[str], out: str, t0: float) -> None:
    """A builder's summary (what it kept, why it dropped the rest) and where it wrote."""
    from agentrft.console import console

    for line in [
        *lines,
        f"wrote {out}/train.jsonl and {out}/val.jsonl in {time.perf_counter() - t0:.1f}s",
    ]:
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def cmd_from_git(args: argparse.Namespace) -> int:
    from agentrft.tasks.file_selection.dataset import build_dataset

    t0 = time.perf_counter()
    report = build_dataset(
        args.repo,
        args.out,
        rev=args.rev,
        max_commits=args.max_commits,
        max_files=args.max_files,
        include=args.include,
        exclude=args.exclude,
        default_excludes=not args.no_default_excludes,
        val_fraction=args.val_fraction,
        worked_examples=args.worked_examples,
        keep_new_only=args.keep_new_only,
        prefill_query=not args.no_prefill_query,
        keep_unfound=args.keep_unfound,
    )
    _print_report(report.lines(), args.out, t0)
    return 0 if report.kept else 1


def cmd_repo_qa(args: argparse.Namespace) -> int:
    from agentrft.tasks.repo_research.dataset import KINDS, build_dataset

    t0 = time.perf_counter()
    report = build_dataset(
        args.repo,
        args.out,
        rev=args.rev,
        val_fraction=args.val_fraction,
        include=args.include,
        exclude=args.exclude,
        kinds=args.kind or KINDS,
        per_file=args.per_file,
        worked_examples=args.worked_examples,
        user_questions=args.questions,
        prefill_first_call=not args.no_prefill,
    )
    _print_report(report.lines(), args.out, t0)
    return 0 if report.train and report.val else 1


def cmd_kernels(args: argparse.Namespace) -> int:
    from agentrft.tasks.kernels.dataset import DEFAULT_TASKS, build_dataset

    t0 = time.perf_counter()
    report = build_dataset(
        args.tasks or DEFAULT_TASKS, args.out, seed=args.seed, prefill=args.prefill_signature
    )
    _print_report(report.lines(), args.out, t0)
    return 0 if report.train else 1


def cmd_code_fix(args: argparse.Namespace) -> int:
    from agentrft.console import console
    from agentrft.tasks.code_fix.dataset import build_dataset

    t0 = time.perf_counter()
    report = build_dataset(
        args.repo,
        args.out,
        rev=args.rev,
        include=args.include,
        exclude=args.exclude,
        tests=args.tests or None,
        test_command=args.test_command,
        kinds=args.kind or None,
        max_per_file=args.max_per_file,
        max_per_function=args.max_per_function,
        min_failing=args.min_failing,
        val_fraction=args.val_fraction,
        hint=args.hint,
        seed=args.seed,
        all_tests_cover=args.all_tests_cover,
        log=lambda line: console.print(line, highlight=False, markup=False, soft_wrap=True),
    )
    _print_report(report.lines(), args.out, t0)
    return 0 if report.kept else 1


def add_commands(subparsers: Any) -> None:
    """Register `data` and its subcommands on the top-level parser's subparsers."""
    data = subparsers.add_parser("data", help="build datasets")
    sub = data.add_subparsers(dest="data_command", required=True)

    g = sub.add_parser(
        "from-git",
        help="file-selection dataset from a repository's history",
        description="One row per commit: the request is the commit message, the answer the files it changed. "
        "Older commits go to train.jsonl, the newest to val.jsonl.",
    )
    g.add_argument("repo", help="path of a local git repository")
    g.add_argument("--out", required=True, help="output directory for train.jsonl and val.jsonl")
    g.add_argument("--rev", default="HEAD", help="history to read (default HEAD)")
    g.add_argument("--max-commits", type=int, default=None, help="read only the newest N commits")
    g.add_argument(
        "--max-files",
        type=int,
        default=DEFAULT_MAX_FILES,
        help=f"drop commits changing more files (default {DEFAULT_MAX_FILES})",
    )
    g.add_argument(
        "--val-fraction",
        type=float,
        default=DEFAULT_VAL_FRACTION,
        help=f"newest share to validation (default {DEFAULT_VAL_FRACTION})",
    )
    g.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="GLOB",
        help="keep only matching paths (gitignore syntax; repeatable)",
    )
    g.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="drop matching paths (gitignore syntax; repeatable)",
    )
    g.add_argument(
        "--no-default-excludes",
        action="store_true",
        help="keep lock files and vendored directories",
    )
    g.add_argument(
        "--keep-new-only",
        action="store_true",
        help="keep commits that only add files (no search can find a file that does not exist yet)",
    )
    g.add_argument(
        "--keep-unfound",
        action="store_true",
        help="keep training commits whose subject line, searched, returns none of their files",
    )
    g.add_argument(
        "--no-prefill-query",
        action="store_true",
        help="leave the search query to the model (default: each row's reply starts as a search for its subject line)",
    )
    g.add_argument(
        "--worked-examples",
        type=int,
        default=DEFAULT_WORKED_EXAMPLES,
        help=f"training commits turned into worked examples that start every row (default {DEFAULT_WORKED_EXAMPLES}; 0 for none)",
    )
    g.set_defaults(func=cmd_from_git)

    from agentrft.tasks.repo_research.dataset import DEFAULT_PER_FILE, KINDS
    from agentrft.tasks.repo_research.dataset import DEFAULT_VAL_FRACTION as QA_VAL_FRACTION
    from agentrft.tasks.repo_research.dataset import DEFAULT_WORKED_EXAMPLES as QA_EXAMPLES

    q = sub.add_parser(
        "repo-qa",
        help="repository-research questions from a repository's own Python code",
        description="Questions whose answers are facts in the code (where X is defined, what F returns or raises, "
        "which function a docstring belongs to, parameter defaults, which files import a module), read with Python's ast "
        "at one revision. Split by file: held-out questions are about files no training question covers.",
    )
    q.add_argument("repo", help="path of a local git repository")
    q.add_argument("--out", required=True, help="output directory for train.jsonl and val.jsonl")
    q.add_argument(
        "--rev",
        default="HEAD",
        help="revision to read (default HEAD); every row records its commit",
    )
    q.add_argument(
        "--val-fraction",
        type=float,
        default=QA_VAL_FRACTION,
        help=f"share of files held out (default {QA_VAL_FRACTION})",
    )
    q.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="GLOB",
        help="read only matching .py files (gitignore syntax; repeatable)",
    )
    q.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="skip matching files (gitignore syntax; repeatable)",
    )
    q.add_argument(
        "--kind",
        action="append",
        choices=KINDS,
        default=[],
        help="only these question kinds (repeatable; default all)",
    )
    q.add_argument(
        "--per-file",
        type=int,
        default=DEFAULT_PER_FILE,
        help=f"questions of each kind per file (default {DEFAULT_PER_FILE})",
    )
    q.add_argument(
        "--questions",
        default=None,
        metavar="JSONL",
        help="your own QA rows (messages + facts) to add; bad rows are refused by file and line",
    )
    q.add_argument(
        "--worked-examples",
        type=int,
        default=QA_EXAMPLES,
        help=f"training questions turned into worked examples (default {QA_EXAMPLES}; 0 for none)",
    )
    q.add_argument(
        "--no-prefill",
        action="store_true",
        help="leave the first tool call to the model (default: each reply starts with its question's first grep, left open)",
    )
    q.set_defaults(func=cmd_repo_qa)

    k = sub.add_parser(
        "kernels",
        help="kernel-writing rows (a faster kernel for a reference PyTorch function) from a task list",
        description="One row per task of a YAML task list (default: the kernels recipe's tasks.yaml). Every task is "
        "validated first: its inputs build and its reference runs on each case; one that cannot run is refused "
        "naming the file and line. Each task's `split` sends it to train.jsonl or val.jsonl.",
    )
    k.add_argument("--out", required=True, help="output directory for train.jsonl and val.jsonl")
    k.add_argument(
        "--tasks",
        default=None,
        metavar="YAML",
        help="task list (default: agentrft/tasks/kernels/tasks.yaml)",
    )
    k.add_argument(
        "--seed", type=int, default=1234, help="seed of every row's random inputs (default 1234)"
    )
    k.add_argument(
        "--prefill-signature",
        action="store_true",
        help="start each reply with the kernel's signature up to `return ` (the easier variant; local models only)",
    )
    k.set_defaults(func=cmd_kernels)

    from agentrft.tasks.code_fix import dataset as cf

    c = sub.add_parser(
        "code-fix",
        help="bug-fixing tasks from a Python project and its own tests",
        description="Inject one single-line bug (flipped comparison, off-by-one, wrong operator, dropped "
        "negation) into a function with Python's ast, run the project's tests in the sandbox, and keep the bug "
        "only where a test fails with it (every test must pass without it). Each row asks to fix the failing "
        "test. Split by source file: held-out rows are about other code.",
    )
    c.add_argument(
        "repo",
        help="a local git repository, or a directory without .git or a Python sdist (.tar.gz, .zip; e.g. from "
        "`pip download --no-deps --no-binary :all: NAME==VERSION`), snapshotted into OUT/source/NAME as one commit",
    )
    c.add_argument("--out", required=True, help="output directory for train.jsonl and val.jsonl")
    c.add_argument("--rev", default="HEAD", help="revision to read (default HEAD)")
    c.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="GLOB",
        help="source files to inject bugs into (gitignore syntax; repeatable; default every .py that is not a test)",
    )
    c.add_argument(
        "--exclude", action="append", default=[], metavar="GLOB", help="source files to skip"
    )
    c.add_argument(
        "--tests",
        action="append",
        default=[],
        metavar="GLOB",
        help=f"test files (repeatable; default {' '.join(cf.DEFAULT_TESTS)}); a test file covers a source file it imports or is named after",
    )
    c.add_argument(
        "--test-command",
        default=cf.DEFAULT_TEST_COMMAND,
        help=f"pytest command the test files are appended to; `python` is this interpreter (default {cf.DEFAULT_TEST_COMMAND!r})",
    )
    c.add_argument(
        "--kind",
        action="append",
        choices=cf.KINDS,
        default=[],
        help="bug kinds (repeatable; default all)",
    )
    c.add_argument(
        "--max-per-file",
        type=int,
        default=cf.DEFAULT_MAX_PER_FILE,
        help=f"bugs tried per file (default {cf.DEFAULT_MAX_PER_FILE})",
    )
    c.add_argument(
        "--max-per-function",
        type=int,
        default=cf.DEFAULT_MAX_PER_FUNCTION,
        help=f"bugs tried per function (default {cf.DEFAULT_MAX_PER_FUNCTION})",
    )
    c.add_argument(
        "--min-failing",
        type=int,
        default=1,
        help="keep a bug only when at least this many tests fail (default 1; 2 keeps one held back)",
    )
    c.add_argument(
        "--val-fraction",
        type=float,
        default=cf.DEFAULT_VAL_FRACTION,
        help=f"share of source files held out (default {cf.DEFAULT_VAL_FRACTION})",
    )
    c.add_argument(
        "--hint",
        choices=cf.HINTS,
        default="none",
        help="none: the failing test only; function: and the buggy function; line: and an edit call prefilled on the "
        "buggy line; repair: and the suspicious lines (fault localization) with numbered fix candidates",
    )
    c.add_argument(
        "--all-tests-cover",
        action="store_true",
        help="every test file covers every source file (for a package whose tests import only the package)",
    )
    c.add_argument("--seed", type=int, default=0, help="which bugs are tried (default 0)")
    c.set_defaults(func=cmd_code_fix)
