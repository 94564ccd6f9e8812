"""`multi` (OpenAI): named sub-graders combined by a `calculate_output` formula, plus
agentrft's **gate** (correctness before style).

    {"type": "multi", "name": "...",
     "graders": {"tests": {...}, "style": {...}},
     "calculate_output": "0.8 * tests + 0.2 * style",
     "gate": {"grader": "tests", "threshold": 1.0, "on_fail": 0}}      # optional (agentrft)

Formula: numbers, the sub-graders' names, `+ - * / ^` (^ is power, right-associative and
tighter than unary minus: -2^2 = -4, 2^-1 = 0.5), parentheses, and the functions
`min max` (one or more arguments) and `abs floor ceil exp sqrt log` (one; log is natural).
It is parsed once at validation by the small recursive-descent parser below (no `eval`);
unknown names fail validation, listing the sub-graders. A math error at grading time
(division by zero, sqrt/log of a negative, overflow) flags the sample
`formula_runtime_error`; it is never scored 0.

Gate: the gate's sub-grader runs first. Below `threshold` the other sub-graders do not run
(no judge calls are spent on the style of wrong code) and the output is `on_fail`: a number,
or a formula (e.g. "0.5 * tests"); only the sub-graders it names run then, e.g. a
`tool_budget` in "budget - 1", so a failing rollout pays for its calls too (it can never go
above what the formula allows). At or above it, the others run concurrently and
`calculate_output` decides. A sub-grader error flags the whole
grade with that sub-grader's flag. Unlike OpenAI, a multi may nest another multi.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import Field

from agentrft.errors import ConfigError
from agentrft.graders.protocol import (
    NAN,
    Grader,
    agrade_safely,
    checked_score,
    grade_safely,
)
from agentrft.graders.spec import BuildContext, Strict
from agentrft.types import Grade

FUNCTIONS: dict[str, tuple[Callable[..., float], int | None]] = {  # name -> (fn, arity; None = 1+)
    "min": (lambda *xs: min(xs), None),
    "max": (lambda *xs: max(xs), None),
    "abs": (abs, 1),
    "floor": (lambda x: float(math.floor(x)), 1),
    "ceil": (lambda x: float(math.ceil(x)), 1),
    "exp": (math.exp, 1),
    "sqrt": (math.sqrt, 1),
    "log": (math.log, 1),
}
_TOKEN = re.compile(
    r"\s*(?:(\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)|([A-Za-z_][A-Za-z0-9_]*)|(\S))"
)


MAX_NESTING = 100  # parentheses, calls, signs and powers inside each other
MAX_TOKENS = 1000


class FormulaError(ArithmeticError):
    """A math error while evaluating a valid formula."""


class Formula:
    """A parsed formula. `names` are the variables it reads. Picklable (plain tuples)."""

    def __init__(self, text: str, where: str = "calculate_output") -> None:
        self.text = text
        self._where = where
        self._tokens = self._lex(text)
        if len(self._tokens) > MAX_TOKENS:
            raise ConfigError(
                f"{where}: the formula has {len(self._tokens)} tokens, over {MAX_TOKENS}; combine sub-scores in a nested multi grader instead"
            )
        self._pos = 0
        self._depth = 0
        self.tree = self._expr()
        if (extra := self._peek()) is not None:
            self._fail(f"unexpected {extra[1]!r}")
        self.names = frozenset(self._names(self.tree))
        del self._tokens, self._pos, self._depth

    # -- lexing and parsing ---------------------------------------------------------------
    def _lex(self, text: str) -> list[tuple[str, str, int]]:
        tokens, pos = [], 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _TOKEN.match(text, pos)
            assert m is not None
            number, name, op = m.groups()
            start = m.start(m.lastindex or 0)
            if op is not None and op not in "+-*/^(),":
                raise ConfigError(
                    f"{self._where}: unexpected character {op!r} at column {start + 1} of {text!r}; allowed: numbers, sub-grader names, + - * / ^ ( ) , and {', '.join(FUNCTIONS)}"
                )
            tokens.append(
                ("num", number, start)
                if number is not None
                else ("name", name, start)
                if name is not None
                else ("op", op, start)
            )
            pos = m.end()
        return tokens

    def _peek(self) -> tuple[str, str, int] | None:
        return self._tokens[self._pos] if self._pos < len(self._tokens) else None

    def _take(self, value: str | None = None) -> tuple[str, str, int] | None:
        tok = self._peek()
        if tok is not None and (value is None or (tok[0] == "op" and tok[1] == value)):
            self._pos += 1
            return tok
        return None

    def _fail(self, why: str) -> None:
        tok = self._peek()
        col = tok[2] + 1 if tok else len(self.text) + 1
        shown = self.text if len(self.text) <= 120 else self.text[:117] + "..."
        raise ConfigError(f"{self._where}: {why} at column {col} of {shown!r}")

    def _expr(self) -> Any:
        node = self._term()
        while (tok := self._take("+") or self._take("-")) is not None:
            node = (tok[1], node, self._term())
        return node

    def _term(self) -> Any:
        node = self._unary()
        while (tok := self._take("*") or self._take("/")) is not None:
            node = (tok[1], node, self._unary())
        return node

    def _unary(self) -> Any:
        # every level of nesting passes here: bound it before Python's recursion limit does
        self._depth += 1
        try:
            if self._depth > MAX_NESTING:
                self._fail(
                    f"the formula is nested more than {MAX_NESTING} levels deep; simplify it"
                )
            if self._take("-"):
                return ("neg", self._unary())
            if self._take("+"):
                return self._unary()
            return self._power()
        finally:
            self._depth -= 1

    def _power(self) -> Any:
        base = self._atom()
        if self._take("^"):
            return ("^", base, self._unary())  # right-assoc: the exponent may itself be a^b or -b
        return base

    def _atom(self) -> Any:
        tok = self._peek()
        if tok is None:
            self._fail("the formula ends too early")
        assert tok is not None
        if tok[0] == "num":
            self._pos += 1
            return ("num", float(tok[1]))
        if tok[0] == "name":
            self._pos += 1
            if self._take("("):
                return self._call(tok[1])
            if tok[1] in FUNCTIONS:
                self._fail(f"{tok[1]} is a function: write {tok[1]}(...)")
            return ("var", tok[1])
        if self._take("("):
            node = self._expr()
            if not self._take(")"):
                self._fail("missing ')'")
            return node
        self._fail(f"unexpected {tok[1]!r}")

    def _call(self, name: str) -> Any:
        if name not in FUNCTIONS:
            self._fail(f"unknown function {name!r}; available: {', '.join(FUNCTIONS)}")
        args = [] if self._peek() is not None and self._peek()[1] == ")" else [self._expr()]  # type: ignore[index]
        while self._take(","):
            args.append(self._expr())
        if not self._take(")"):
            self._fail(f"missing ')' after the arguments of {name}")
        arity = FUNCTIONS[name][1]
        if (arity is None and not args) or (arity is not None and len(args) != arity):
            self._fail(
                f"{name} takes {'one or more arguments' if arity is None else 'exactly one argument'}, got {len(args)}"
            )
        return ("call", name, tuple(args))

    def _names(self, node: Any) -> list[str]:
        kind = node[0]
        if kind == "var":
            return [node[1]]
        if kind == "num":
            return []
        if kind == "call":
            return [n for a in node[2] for n in self._names(a)]
        return [n for child in node[1:] for n in self._names(child)]

    # -- evaluation --------------------------------------------------------------------------
    def evaluate(self, env: Mapping[str, float]) -> float:
        """The value for these variable values; FormulaError on a math error."""
        try:
            value = _eval(self.tree, env)
        except (ZeroDivisionError, ValueError, OverflowError) as exc:
            raise FormulaError(f"{self.text!r}: {exc}") from None
        if not math.isfinite(value):
            raise FormulaError(f"{self.text!r} is not finite ({value})")
        return value


def _eval(node: Any, env: Mapping[str, float]) -> float:
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "var":
        return float(env[node[1]])
    if kind == "neg":
        return -_eval(node[1], env)
    if kind == "call":
        fn, _ = FUNCTIONS[node[1]]
        return float(fn(*(_eval(a, env) for a in node[2])))
    a, b = _eval(node[1], env), _eval(node[2], env)
    if kind == "+":
        return a + b
    if kind == "-":
        return a - b
    if kind == "*":
        return a * b
    if kind == "/":
        if b == 0:
            raise ZeroDivisionError("division by zero")
        return a / b
    return math.pow(a, b)


class GateSpec(Strict):
    grader: str
    threshold: float = 1.0
    on_fail: float | str = 0.0


class MultiSpec(Strict):
    type: Literal["multi"]
    name: str = "multi"
    graders: dict[str, Any] = Field(min_length=1)
    calculate_output: str
    gate: GateSpec | None = None


def _flat(name: str, grade: Grade) -> dict[str, float]:
    out = {name: grade.score}
    out.update({f"{name}.{k}": v for k, v in grade.sub_scores.items()})
    return out


class MultiGrader:
    type = "multi"

    def __init__(
        self, spec: MultiSpec, graders: dict[str, Grader], formula: Formula, on_fail: Formula | None
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.graders = graders
        self.formula = formula
        self.on_fail = on_fail

    @property
    def children(self) -> list[Grader]:
        return list(self.graders.values())

    def grade(
        self, sample: Mapping[str, Any], item: Mapping[str, Any], trace_id: str = ""
    ) -> Grade:
        def run() -> Grade:
            grades: dict[str, Grade] = {}
            for name in self._order():
                grades[name] = self.graders[name].grade(sample, item, trace_id)
                if self._stop(name, grades[name]):
                    for other in self._on_fail_names(grades[name]):
                        grades[other] = self.graders[other].grade(sample, item, trace_id)
                    break
            return self._combine(grades)

        return grade_safely(run)

    async def agrade(
        self, sample: Mapping[str, Any], item: Mapping[str, Any], trace_id: str = ""
    ) -> Grade:
        async def run() -> Grade:
            grades: dict[str, Grade] = {}
            names = self._order()
            if self.spec.gate is not None:
                gate = names.pop(0)
                grades[gate] = await self.graders[gate].agrade(sample, item, trace_id)
                if self._stop(gate, grades[gate]):
                    names = self._on_fail_names(grades[gate])
                    results = await asyncio.gather(
                        *(self.graders[n].agrade(sample, item, trace_id) for n in names)
                    )
                    grades.update(zip(names, results, strict=True))
                    return self._combine(grades)
            results = await asyncio.gather(
                *(self.graders[n].agrade(sample, item, trace_id) for n in names)
            )
            grades.update(zip(names, results, strict=True))
            return self._combine(grades)

        return await agrade_safely(run)

    def _order(self) -> list[str]:
        names = list(self.graders)
        if self.spec.gate is not None:
            names.remove(self.spec.gate.grader)
            names.insert(0, self.spec.gate.grader)
        return names

    def _on_fail_names(self, gate: Grade) -> list[str]:
        """The sub-graders `on_fail` reads besides the gate's, graded when the gate fails."""
        if gate.error is not None or self.on_fail is None or self.spec.gate is None:
            return []
        return [n for n in self.graders if n in self.on_fail.names and n != self.spec.gate.grader]

    def _stop(self, name: str, grade: Grade) -> bool:
        gate = self.spec.gate
        return grade.error is not None or (
            gate is not None and name == gate.grader and grade.score < gate.threshold
        )

    def _combine(self, grades: dict[str, Grade]) -> Grade:
        sub: dict[str, float] = {}
        for name, g in grades.items():
            if g.error is None:
                sub.update(_flat(name, g))
        for name, g in grades.items():
            if g.error is not None:
                details = g.metrics.get("error_details", "")
                return Grade(
                    NAN,
                    sub,
                    {"error_details": f"sub-grader {name!r}: {details}", "failed_grader": name},
                    g.error,
                )
        gate = self.spec.gate
        formula, metrics = self.formula, {}
        if gate is not None:
            passed = grades[gate.grader].score >= gate.threshold
            metrics["gate"] = "passed" if passed else "failed"
            if not passed:
                assert self.on_fail is not None
                formula = self.on_fail
        try:
            # rounded off at 1e-12, so that 0.7 + 0.2 + 0.1 is 1.0 (a pass at threshold 1), not
            # 0.9999999999999999
            score = round(
                checked_score(formula.evaluate({n: g.score for n, g in grades.items()})), 12
            )
        except FormulaError as exc:
            return Grade(NAN, sub, {**metrics, "error_details": str(exc)}, "formula_runtime_error")
        return Grade(score, sub, metrics)


def build(spec: MultiSpec, path: str, ctx: BuildContext) -> MultiGrader:
    bad = [
        n for n in spec.graders if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n) or n in FUNCTIONS
    ]
    if bad:
        raise ConfigError(
            f"{path}.graders: the key(s) {bad} cannot appear in a formula; use names like `tests` or `style_2` (letters, digits, _), not a function name"
        )
    graders = {name: ctx.child(sub, f"{path}.graders.{name}") for name, sub in spec.graders.items()}
    formula = Formula(spec.calculate_output, f"{path}.calculate_output")
    unknown = sorted(formula.names - set(graders))
    if unknown:
        raise ConfigError(
            f"{path}.calculate_output: unknown name(s) {', '.join(unknown)} in {spec.calculate_output!r}; the sub-graders are: {', '.join(graders)}"
        )
    on_fail = None
    if spec.gate is not None:
        if spec.gate.grader not in graders:
            raise ConfigError(
                f"{path}.gate.grader: {spec.gate.grader!r} is not a sub-grader; use one of: {', '.join(graders)}"
            )
        on_fail = Formula(str(spec.gate.on_fail), f"{path}.gate.on_fail")
        extra = sorted(on_fail.names - set(graders))
        if extra:
            raise ConfigError(
                f"{path}.gate.on_fail: unknown name(s) {', '.join(extra)}; the sub-graders are: {', '.join(graders)}"
            )
    return MultiGrader(spec, graders, formula, on_fail)
