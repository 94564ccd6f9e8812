"""One exception tree for agentrft, sorted by the boundary a failure crossed.

    AgentRFTError
    ├── ConfigError (ValueError)          a job, dataset or grader file is wrong: says where and how to fix
    ├── ModelNotFoundError (FileNotFoundError)  the model is not installed / the path does not exist
    ├── SandboxUnavailable (RuntimeError)  untrusted code was asked to run but bubblewrap is missing
    └── EndpointUnavailable                an HTTP endpoint kept failing (5xx / timeout / connection) after retries
        ├── ToolUnavailable                    ... a tool: the rollout is discarded
        └── GraderUnavailable                  ... an endpoint or model grader: the sample is discarded

Rollout- and grade-time failures do not propagate as exceptions out of a step: they are
recorded on the trajectory or grade (a bad rollout is data, not a crash) and counted.
"""

from __future__ import annotations


class AgentRFTError(Exception):
    """Base of every error agentrft raises on purpose."""


class ConfigError(AgentRFTError, ValueError):
    """Invalid user input (job, dataset, tool or grader spec). The message names the file,
    the line or field, and the fix."""


class ModelNotFoundError(AgentRFTError, FileNotFoundError):
    """The requested model cannot be found locally. Nothing is downloaded at run time."""


class SandboxUnavailable(AgentRFTError, RuntimeError):
    """Untrusted code would have to run without isolation; agentrft refuses instead."""


class EndpointUnavailable(AgentRFTError):
    """An HTTP endpoint failed with 5xx, a timeout, a connection error or a malformed reply on
    every attempt."""


class ToolUnavailable(EndpointUnavailable):
    """A tool stayed unavailable: the rollout is discarded, never scored 0."""


class GraderUnavailable(EndpointUnavailable):
    """A remote grader stayed unavailable: the sample is discarded, never scored 0."""


class EngineUnavailable(AgentRFTError, RuntimeError):
    """The rollout engine (a vLLM server) is not installed, did not start, or stopped
    answering."""


class EngineMismatch(AgentRFTError):
    """The engine's log-probs of the sampled tokens are far from the trainer's: the engine is
    not sampling from the policy being trained (a stale adapter, a dtype or template drift)."""
