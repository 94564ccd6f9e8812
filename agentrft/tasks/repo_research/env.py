"""Repository-research environment (stage: rollout tools) for rows built by
`agentrft data repo-qa`: the model answers a question about a repository's code by searching
and reading the repository as it was at the row's `commit`.

The tools are the file-selection recipe's, from `agentrft.tools.repo_workspace`: search
(ranked BM25 over paths, identifiers and text), list_files, grep and read_file. Each rollout
(`trace_id`) gets its own workspace, the commit exported with `git archive` on its first
file tool call (search reads git directly and needs none), deleted when the rollout is
graded and cleaned up. The workspace holds no `.git`, so no other revision can be read, and
the tools never see a row's `facts`: the answer is in the code or nowhere. Every path is
confined to the workspace; a call the model got wrong is a 400 whose text it reads.

Grading is the job's built-in `fact_recall` (with a tool budget), so this server has no
/grade of its own. Run by agentrft for the job (job.yaml, `agentrft.environment`), or by hand:
    uvicorn env:app --port 8700
"""

from __future__ import annotations

from agentrft.tools.envkit import ToolServer
from agentrft.tools.repo_workspace import register_repo_tools

env = ToolServer("repo-research")
tools = register_repo_tools(env, field="commit")
app = env.app
