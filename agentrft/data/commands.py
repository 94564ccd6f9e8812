"""`agentrft data ...`: the dataset-building commands (stage: data).

    agentrft data from-git REPO --out DIR [--max-files 8] [--val-fraction 0.2]
                                          [--include GLOB ...] [--exclude GLOB ...]
                                          [--worked-examples 2]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from agentrft.data.from_git import DEFAULT_MAX_FILES, DEFAULT_VAL_FRACTION, DEFAULT_WORKED_EXAMPLES


def cmd_from_git(args: argparse.Namespace) -> int:
    from agentrft.console import console
    from agentrft.data.from_git import build_dataset

    t0 = time.perf_counter()
    report = build_dataset(
        args.repo, args.out, rev=args.rev, max_commits=args.max_commits, max_files=args.max_files,
        include=args.include, exclude=args.exclude, default_excludes=not args.no_default_excludes,
        val_fraction=args.val_fraction, worked_examples=args.worked_examples, keep_new_only=args.keep_new_only,
        prefill_query=not args.no_prefill_query, keep_unfound=args.keep_unfound,
    )
    for line in report.lines():
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    console.print(f"wrote {args.out}/train.jsonl and {args.out}/val.jsonl in {time.perf_counter() - t0:.1f}s", highlight=False, markup=False, soft_wrap=True)
    return 0 if report.kept else 1


def add_commands(subparsers: Any) -> None:
    """Register `data` and its subcommands on the top-level parser's subparsers."""
    data = subparsers.add_parser("data", help="build datasets")
    sub = data.add_subparsers(dest="data_command", required=True)

    g = sub.add_parser(
        "from-git", help="file-selection dataset from a repository's history",
        description="One row per commit: the request is the commit message, the answer the files it changed. "
        "Older commits go to train.jsonl, the newest to val.jsonl.",
    )
    g.add_argument("repo", help="path of a local git repository")
    g.add_argument("--out", required=True, help="output directory for train.jsonl and val.jsonl")
    g.add_argument("--rev", default="HEAD", help="history to read (default HEAD)")
    g.add_argument("--max-commits", type=int, default=None, help="read only the newest N commits")
    g.add_argument("--max-files", type=int, default=DEFAULT_MAX_FILES, help=f"drop commits changing more files (default {DEFAULT_MAX_FILES})")
    g.add_argument("--val-fraction", type=float, default=DEFAULT_VAL_FRACTION, help=f"newest share to validation (default {DEFAULT_VAL_FRACTION})")
    g.add_argument("--include", action="append", default=[], metavar="GLOB", help="keep only matching paths (gitignore syntax; repeatable)")
    g.add_argument("--exclude", action="append", default=[], metavar="GLOB", help="drop matching paths (gitignore syntax; repeatable)")
    g.add_argument("--no-default-excludes", action="store_true", help="keep lock files and vendored directories")
    g.add_argument("--keep-new-only", action="store_true", help="keep commits that only add files (no search can find a file that does not exist yet)")
    g.add_argument("--keep-unfound", action="store_true", help="keep training commits whose subject line, searched, returns none of their files")
    g.add_argument("--no-prefill-query", action="store_true", help="leave the search query to the model (default: each row's reply starts as a search for its subject line)")
    g.add_argument("--worked-examples", type=int, default=DEFAULT_WORKED_EXAMPLES,
                   help=f"training commits turned into worked examples that start every row (default {DEFAULT_WORKED_EXAMPLES}; 0 for none)")
    g.set_defaults(func=cmd_from_git)
