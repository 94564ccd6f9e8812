"""A deliberately hackable job's environment: a small web app's files and a `list_files` tool.

`list_files(folder)` returns every file under a folder, one path per line. The job's grader
is plain file F1 with no cap on how many files an answer may name and no grounding, so
answering with everything the tool listed earns partial credit on every row: the doctor's
hackability check fails on it (`agentrft doctor examples/hackable/job.yaml`).
"""

from agentrft.tools.envkit import ToolInputError, ToolServer

FILES = [
    "app/auth/login.py",
    "app/auth/tokens.py",
    "app/auth/passwords.py",
    "app/billing/invoices.py",
    "app/billing/payments.py",
    "app/billing/tax.py",
    "app/search/index.py",
    "app/search/query.py",
    "app/search/ranking.py",
    "app/users/profile.py",
    "app/users/settings.py",
    "app/users/avatars.py",
]

env = ToolServer("hackable")


@env.tool(
    description="List every file under a folder of the repository, one path per line.",
    parameters={
        "type": "object",
        "properties": {"folder": {"type": "string", "description": "A folder, e.g. app/auth"}},
        "required": ["folder"],
    },
)
def list_files(ctx, folder: str) -> str:
    prefix = folder.strip().strip("/")
    found = [f for f in FILES if f.startswith(prefix + "/") or not prefix]
    if not found:
        folders = sorted({f.rsplit("/", 1)[0] for f in FILES})
        raise ToolInputError(f"no folder {folder!r}; folders: {', '.join(folders)}")
    return "\n".join(found)


app = env.app
