"""Grader JSON -> typed spec, with errors that name the field path and the fix.

Every grader family declares its spec as a `Strict` pydantic model (unknown keys are
errors, so a typo fails at validation rather than silently changing the reward).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from agentrft.config import Strict, fix_for
from agentrft.errors import ConfigError

__all__ = ["BuildContext", "Strict", "parse_spec"]

M = TypeVar("M", bound=BaseModel)


def parse_spec(model: type[M], data: Any, path: str) -> M:
    """Validate `data` against `model`; ConfigError lists every problem as `path.field`."""
    if not isinstance(data, dict):
        raise ConfigError(
            f'{path}: a grader must be a JSON object with a "type", got {type(data).__name__}'
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = [f"{path}: invalid {data.get('type', 'grader')} grader"]
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            where = f"{path}.{loc}" if loc else path
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"  - `{where}`: {msg} -> {fix_for(err)}")
        raise ConfigError("\n".join(lines)) from None


@dataclass
class BuildContext:
    """What building a grader tree may need besides its JSON.

    `judge`: agentrft's judge settings (see judge.py), or None for the defaults.
    `python_limits`: sandbox limits for python graders (see agentrft.sandbox.Limits).
    `check_resources`: False for pure JSON validation (nothing local is looked up).
    `namespaces`: what templates may name here (fact_recall's judge also gets `fact`).
    `build`: builds a nested grader at a field path (set by build.py).
    """

    judge: Any = None
    python_limits: Any = None
    check_resources: bool = True
    namespaces: tuple[str, ...] = ("item", "sample")
    build: Callable[[Any, str, BuildContext], Any] | None = None
    judges: dict[Any, Any] = field(default_factory=dict)  # one judge per model, shared in the tree

    def child(self, spec: Any, path: str, **changes: Any) -> Any:
        """Build a nested grader; `changes` override fields for that subtree only."""
        assert self.build is not None
        return self.build(spec, path, dataclasses.replace(self, **changes) if changes else self)
