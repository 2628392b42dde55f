"""The cost model's formulas compiled for one profile: ``ops`` that write code.

The formulas in :mod:`xbench.core.costmodel` are written once over ``ops`` (floats for one
request, numpy arrays for a grid). :class:`TracingOps` is a third kind of number: running a
formula on :class:`Traced` values records each operation as a line of Python, with the
profile's coefficients folded in as constants. What comes out is one straight-line function
per profile and request shape: no tuple unpacking, no attribute lookups of terms, no calls
through ``ops``, and only the operations the answer depends on (the rest are dropped), so a
scheduler's per-request call costs a fraction of the general formula's. It computes the
same floating-point operations in the same order as the formulas do on floats, so its
answers are the same bits; a test holds it to that.

Rules for a formula that is traced: branch on profile constants freely (they are Python
values while tracing), but choose between request-dependent values with ``ops.where`` (a
traced value has no truth value and says so); inputs are finite (``0 * x`` folds to 0).
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_right
from itertools import count

_FOLD = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "&": operator.and_,
    "|": operator.or_,
}


class Traced:
    """A request-dependent value while a formula is traced: its variable's name."""

    __slots__ = ("name", "tracer")

    def __init__(self, tracer: Tracer, name: str):
        self.tracer, self.name = tracer, name

    def __bool__(self):
        raise TypeError("a traced value has no truth value: choose with ops.where")

    def _op(op):  # noqa: N805 (builds the operator methods below)
        return lambda a, b: a.tracer.binary(op, a, b)

    def _rop(op):  # noqa: N805
        return lambda a, b: a.tracer.binary(op, b, a)

    __add__, __radd__ = _op("+"), _rop("+")
    __sub__, __rsub__ = _op("-"), _rop("-")
    __mul__, __rmul__ = _op("*"), _rop("*")
    __truediv__, __rtruediv__ = _op("/"), _rop("/")
    __and__, __rand__ = _op("&"), _rop("&")
    __or__, __ror__ = _op("|"), _rop("|")
    __lt__, __le__, __gt__, __ge__ = _op("<"), _op("<="), _op(">"), _op(">=")
    __eq__, __ne__ = _op("=="), _op("!=")
    __hash__ = object.__hash__

    def __neg__(self):
        return self.tracer.line(f"-{self.name}", (self.name,))


def _is_zero(x) -> bool:
    return type(x) in (float, int) and x == 0


def _is_one(x) -> bool:
    return type(x) in (float, int) and x == 1


class Tracer:
    """Records the lines of one function: each operation on traced values is one line
    ``vN = <expression>`` (the same expression twice is one line), constants are folded."""

    def __init__(self, array: bool = False):
        self.lines: list[tuple[tuple, str, tuple]] = []  # (targets, expression, uses)
        self.constants: dict = {}
        self._tables: dict = {}  # table -> its constant's name
        self._seen: dict[str, Traced | tuple] = {}
        self._names = count()
        # array: the function runs on numpy arrays (a block of requests), choices and
        # lookups by numpy's where and searchsorted; else on Python floats
        self.array = array

    def input(self, name: str) -> Traced:
        """A field of the function's argument, a NamedTuple (unpacked on entry)."""
        return Traced(self, name)

    def text(self, x) -> str:
        """``x`` as it appears in an expression."""
        if isinstance(x, Traced):
            return x.name
        if isinstance(x, float) and not math.isfinite(x):
            return "INF" if x > 0 else "-INF" if x < 0 else "NAN"
        if isinstance(x, (bool, int, float, str)) or x is None:
            return repr(x)
        key = (tuple(map(type, x)), x)  # (True == 1: a table of flags is not one of ints)
        if key not in self._tables:  # a table (tuple): a named constant
            name = self._tables[key] = f"K{len(self.constants)}"
            if self.array:
                import numpy as np

                x = np.asarray(x)
            self.constants[name] = x
        return self._tables[key]

    def line(self, expression: str, uses: tuple, width: int = 0):
        """The value(s) of ``expression``; ``width`` > 0 unpacks a tuple of that many."""
        if expression in self._seen:
            return self._seen[expression]
        targets = tuple(f"v{next(self._names)}" for _ in range(max(width, 1)))
        self.lines.append((targets, expression, uses))
        out = Traced(self, targets[0]) if not width else tuple(Traced(self, t) for t in targets)
        self._seen[expression] = out
        return out

    def binary(self, op: str, a, b):
        traced_a, traced_b = isinstance(a, Traced), isinstance(b, Traced)
        if not (traced_a or traced_b):
            return _FOLD[op](a, b)
        if op == "+" and (_is_zero(a) or _is_zero(b)):
            return b if _is_zero(a) else a
        if op == "-" and _is_zero(b):
            return a
        if op == "*":
            if _is_one(a) or _is_one(b):
                return b if _is_one(a) else a
            if _is_zero(a) or _is_zero(b):
                return 0.0
        if op in ("&", "|"):  # a flag known while tracing settles or drops out
            known = a if type(a) is bool else b if type(b) is bool else None
            if known is not None:
                other = b if known is a else a
                return other if known == (op == "&") else known
        if op == "/" and _is_one(b):
            return a
        uses = tuple(x.name for x in (a, b) if isinstance(x, Traced))
        return self.line(f"{self.text(a)} {op} {self.text(b)}", uses)

    def source(self, name: str, fields: tuple, results: tuple) -> str:
        """The function's text: its argument unpacked into ``fields`` (one unpacking costs
        less than reading two attributes), the lines ``results`` depend on, its return."""
        needed = {x.name for x in results if isinstance(x, Traced)}
        kept = []
        for targets, expression, uses in reversed(self.lines):
            if needed.intersection(targets):
                kept.append(f"    {', '.join(targets)} = {expression}")
                needed.update(uses)
        unpacked = ", ".join(f if f in needed else "_" for f in fields)
        body = "\n".join([f"    {unpacked}, = r", *reversed(kept)])
        returned = ", ".join(self.text(x) for x in results)
        return f"def {name}(r):\n{body}\n    return ({returned},)\n"

    def compile(self, name: str, fields: tuple, results: tuple):
        """The function of one argument ``r``, a tuple of ``fields``, that returns
        ``results`` as a tuple."""
        text = self.source(name, fields, results)
        namespace = {"bisect_right": bisect_right, "expm1": math.expm1, "INF": math.inf}
        namespace |= {"NAN": math.nan, **self.constants}
        if self.array:
            import numpy as np

            namespace |= {
                "where": np.where, "searchsorted": np.searchsorted, "minimum": np.minimum,
                "maximum": np.maximum, "expm1": np.expm1,
            }  # fmt: skip
        exec(compile(text, f"<xbench: {name}>", "exec"), namespace)  # noqa: S102 (our own text)
        function = namespace[name]
        function.source = text
        return function


class TracingOps:
    """The model's lookups and choices, recorded (``ops`` for :class:`Tracer`)."""

    def __init__(self, tracer: Tracer):
        self.tracer = tracer

    def piece(self, breaks: tuple, pieces: tuple, x):
        if not isinstance(x, Traced):
            return pieces[bisect_right(breaks, x)]
        t = self.tracer
        if not t.array:
            index = t.line(f"bisect_right({t.text(breaks)}, {x.name})", (x.name,))
            return t.line(f"{t.text(pieces)}[{index.name}]", (index.name,), width=len(pieces[0]))
        index = t.line(f"searchsorted({t.text(breaks)}, {x.name}, 'right')", (x.name,))
        return tuple(
            t.line(f"{t.text(tuple(column))}[{index.name}]", (index.name,))
            for column in zip(*pieces, strict=True)
        )

    def where(self, cond, if_true, if_false):
        if not isinstance(cond, Traced):
            return if_true if cond else if_false
        if not isinstance(if_true, Traced) and type(if_true) is type(if_false):
            if if_true == if_false:
                return if_true
        t = self.tracer
        uses = tuple(x.name for x in (cond, if_true, if_false) if isinstance(x, Traced))
        a, b = t.text(if_true), t.text(if_false)
        if t.array:
            return t.line(f"where({cond.name}, {a}, {b})", uses)
        return t.line(f"{a} if {cond.name} else {b}", uses)

    def any(self, x) -> bool:
        return True if isinstance(x, Traced) else bool(x)

    def expm1(self, x):
        if not isinstance(x, Traced):
            return math.expm1(x)
        return self.tracer.line(f"expm1({x.name})", (x.name,))

    def minimum(self, a, b):
        if not (isinstance(a, Traced) or isinstance(b, Traced)):
            return a if a <= b else b
        if self.tracer.array:
            return self._call("minimum", a, b)
        return self.where(a <= b, a, b)

    def maximum(self, a, b):
        if not (isinstance(a, Traced) or isinstance(b, Traced)):
            return a if a >= b else b
        if self.tracer.array:
            return self._call("maximum", a, b)
        return self.where(a >= b, a, b)

    def _call(self, function: str, *args):
        t = self.tracer
        uses = tuple(x.name for x in args if isinstance(x, Traced))
        return t.line(f"{function}({', '.join(map(t.text, args))})", uses)

    def pick(self, index, table: tuple):
        """``table[index]``: a profile constant chosen by a request-dependent index."""
        if not isinstance(index, Traced):
            return table[index]
        if len(set(map(repr, table))) == 1:
            return table[0]
        t = self.tracer
        return t.line(f"{t.text(tuple(table))}[{index.name}]", (index.name,))
