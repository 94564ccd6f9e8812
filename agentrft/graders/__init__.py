"""Graders: rollout -> **grade** -> advantages. OpenAI's grader JSON, unchanged, plus
agentrft's additions (file_f1, fact_recall, tool_budget, endpoint, the multi gate).

    grader = build_grader(job.rl.grader, judge=job.agentrft.judge)
    groups, stats = grade_rollouts(groups, grader, env_url)  # Group.grades filled
    rewards = [reward_of(gr) for gr in groups[0].grades]     # NaN: discarded or failed
    limit = tool_call_limit(grader)                          # stop rollouts past a tool_budget

One module per family; `multi.py` holds the formula parser. Heavy libraries (nltk, the
embedding model, a judge model) load on first use, so importing this package is cheap.
"""

from agentrft.graders.build import (
    KNOWN_TYPES,
    build_grader,
    load_grader_spec,
    tool_call_limit,
    validate_grader,
)
from agentrft.graders.groups import grade_groups, grade_rollouts, reward_of
from agentrft.graders.judge import JudgeConfig
from agentrft.graders.protocol import ERROR_FLAGS, Grader
from agentrft.graders.sample import sample_from_text, sample_from_trajectory

__all__ = [
    "ERROR_FLAGS",
    "KNOWN_TYPES",
    "Grader",
    "JudgeConfig",
    "build_grader",
    "grade_groups",
    "grade_rollouts",
    "load_grader_spec",
    "reward_of",
    "sample_from_text",
    "sample_from_trajectory",
    "tool_call_limit",
    "validate_grader",
]
