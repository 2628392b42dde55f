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
import threading
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
# The numpy function of each operator, for the array form (the same operation, into a buffer)
_UFUNC = {
    "+": "add", "-": "subtract", "*": "multiply", "/": "true_divide", "<": "less",
    "<=": "less_equal", ">": "greater", ">=": "greater_equal", "==": "equal",
    "!=": "not_equal", "&": "logical_and", "|": "logical_or",
}  # fmt: skip
_FLAG_OPS = ("<", "<=", ">", ">=", "==", "!=", "&", "|")


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
        t = self.tracer
        return t.line(f"-{self.name}", (self.name,), op=("negative", self), kind=t.kind(self))


def _is_zero(x) -> bool:
    return type(x) in (float, int) and x == 0


def _is_one(x) -> bool:
    return type(x) in (float, int) and x == 1


class Tracer:
    """Records the lines of one function: each operation on traced values is one line
    ``vN = <expression>`` (the same expression twice is one line), constants are folded."""

    def __init__(self, array: bool = False):
        # (targets, expression, uses, op, kind): op is the array form's (function and
        # arguments; None: the expression as it is), kind its result's (f: float, b: flag,
        # i: integer, x: anything else)
        self.lines: list[tuple] = []
        self.kinds: dict[str, str] = {}
        self.inputs: list[str] = []
        self.constants: dict = {}
        self._tables: dict = {}  # table -> its constant's name
        self._seen: dict[str, Traced | tuple] = {}
        self._names = count()
        # array: the function runs on numpy arrays (a block of requests), choices and
        # lookups by numpy's where and searchsorted; else on Python floats
        self.array = array

    def input(self, name: str, kind: str = "f") -> Traced:
        """A field of the function's argument, a tuple (unpacked on entry)."""
        self.kinds[name] = kind
        self.inputs.append(name)
        return Traced(self, name)

    def kind(self, x) -> str:
        if isinstance(x, Traced):
            return self.kinds[x.name]
        return {bool: "b", int: "i", float: "f"}.get(type(x), "x")

    def merged_kind(self, *values) -> str:
        """The kind that holds every one of ``values`` (a float holds an integer)."""
        kinds = {self.kind(v) for v in values}
        for kind in ("x", "f", "i", "b"):
            if kind in kinds:
                return kind
        return "x"

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

    def line(self, expression: str, uses: tuple, width: int = 0, op=None, kind: str = "f"):
        """The value(s) of ``expression``; ``width`` > 0 unpacks a tuple of that many."""
        if expression in self._seen:
            return self._seen[expression]
        targets = tuple(f"v{next(self._names)}" for _ in range(max(width, 1)))
        self.lines.append((targets, expression, uses, op, kind))
        for target in targets:
            self.kinds[target] = kind
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
        kind = "b" if op in _FLAG_OPS else "f"
        return self.line(
            f"{self.text(a)} {op} {self.text(b)}", uses, op=(_UFUNC[op], a, b), kind=kind
        )

    def source(self, name: str, fields: tuple, results: tuple) -> str:
        """The function's text: its argument unpacked into ``fields`` (one unpacking costs
        less than reading two attributes), the lines ``results`` depend on, its return."""
        kept, needed = self.kept(results)
        unpacked = ", ".join(f if f in needed else "_" for f in fields)
        returned = [self.text(x) for x in results]
        if self.array:  # results computed into the caller's arrays come back as None
            body, direct = _in_buffers(self, kept, results)
            returned = ["None" if j in direct else text for j, text in enumerate(returned)]
        else:
            body = [f"{', '.join(targets)} = {expression}" for targets, expression, *_ in kept]
        unpacking = [f"{unpacked}, = r"] if fields else []  # (a grid of defaults: no column)
        body = "\n".join(f"    {line}" for line in [*unpacking, *body])
        arguments = "r, out" if self.array else "r"
        return f"def {name}({arguments}):\n{body}\n    return ({', '.join(returned)},)\n"

    def kept(self, results: tuple) -> tuple[list[tuple], set[str]]:
        """The lines ``results`` depend on, in order, and every name they read."""
        needed = {x.name for x in results if isinstance(x, Traced)}
        kept = []
        for line in reversed(self.lines):
            if needed.intersection(line[0]):
                kept.append(line)
                needed.update(line[2])
        kept.reverse()
        return kept, needed

    def compile(self, name: str, fields: tuple, results: tuple):
        """The function of one argument ``r``, a tuple of ``fields``, that returns
        ``results`` as a tuple. The array form takes a second, ``out``: one array per
        result, where a result computed from the inputs is written (and None returned)."""
        text = self.source(name, fields, results)
        namespace = {"bisect_right": bisect_right, "expm1": math.expm1, "INF": math.inf}
        namespace |= {"NAN": math.nan, **self.constants}
        if self.array:
            import numpy as np

            namespace |= {name: getattr(np, name) for name in (*_UFUNC.values(), "minimum")}
            namespace |= {name: getattr(np, name) for name in ("maximum", "expm1", "negative")}
            namespace |= {"searchsorted": np.searchsorted, "take": np.take, "copyto": np.copyto}
            namespace["scratch"] = _scratch
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
        found = ("bisect_right", breaks, x)  # (each line's op: what native_code builds from)
        if not t.array:
            index = t.line(f"bisect_right({t.text(breaks)}, {x.name})", (x.name,), op=found)
            expression, row = f"{t.text(pieces)}[{index.name}]", ("row", pieces, index)
            return t.line(expression, (index.name,), width=len(pieces[0]), op=row)
        index = t.line(
            f"searchsorted({t.text(breaks)}, {x.name}, 'right')", (x.name,), op=found, kind="x"
        )
        return tuple(self._take(tuple(column), index) for column in zip(*pieces, strict=True))

    def _take(self, table: tuple, index):
        t = self.tracer
        expression = f"{t.text(table)}[{index.name}]"
        kind = t.merged_kind(*table)
        return t.line(expression, (index.name,), op=("take", table, index), kind=kind)

    def where(self, cond, if_true, if_false):
        if not isinstance(cond, Traced):
            return if_true if cond else if_false
        if not isinstance(if_true, Traced) and type(if_true) is type(if_false):
            if if_true == if_false:
                return if_true
        t = self.tracer
        uses = tuple(x.name for x in (cond, if_true, if_false) if isinstance(x, Traced))
        a, b = t.text(if_true), t.text(if_false)
        kind = t.merged_kind(if_true, if_false)
        op = ("where", cond, if_true, if_false)
        if t.array:
            return t.line(f"where({cond.name}, {a}, {b})", uses, op=op, kind=kind)
        return t.line(f"{a} if {cond.name} else {b}", uses, op=op, kind=kind)

    def any(self, x) -> bool:
        return True if isinstance(x, Traced) else bool(x)

    def expm1(self, x):
        if not isinstance(x, Traced):
            return math.expm1(x)
        return self._call("expm1", x)

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
        expression = f"{function}({', '.join(map(t.text, args))})"
        kind = "f" if function == "expm1" else t.merged_kind(*args)
        return t.line(expression, uses, op=(function, *args), kind=kind)

    def pick(self, index, table: tuple):
        """``table[index]``: a profile constant chosen by a request-dependent index."""
        if not isinstance(index, Traced):
            return table[index]
        if len(set(map(repr, table))) == 1:
            return table[0]
        return self._take(tuple(table), index)


# ---------------------------------------------------------------------------------------
# The array form: every operation writes into a buffer of a per-thread scratch, reused once
# its value is dead. A new array per operation would cost more than the operation: blocks
# of more than 128 KiB come from mmap, so every temporary faults its pages in afresh.
# ---------------------------------------------------------------------------------------

_DTYPE = {"f": "float64", "b": "bool", "i": "int64"}
_scratch_local = threading.local()


def _scratch(kind: str, count: int, n: int):
    """``count`` buffers of ``n`` values of ``kind``, this thread's (rows of one array)."""
    import numpy as np

    pool = _scratch_local.__dict__
    have = pool.get(kind)
    if have is None or have.shape[0] < count or have.shape[1] < n:
        rows = max(count, 0 if have is None else have.shape[0])
        width = max(n, 0 if have is None else have.shape[1])
        have = pool[kind] = np.empty((rows, width), _DTYPE[kind])
    return have[:count, :n]


def _in_buffers(tracer: Tracer, kept: list, results: tuple) -> tuple[list[str], set]:
    """The lines of the array form: each operation into a buffer (``F[3]``, ``B[0]``,
    ``I[1]``: float, flag, integer), the buffers of values no line reads again reused; a
    result straight into the caller's array for it (``out[j]``). Returns (the lines, the
    results so written)."""
    computed = {line[0][0] for line in kept if line[3] is not None and line[4] in _DTYPE}
    direct: dict[str, int] = {}
    for j, x in enumerate(results):
        if isinstance(x, Traced) and x.name in computed and x.name not in direct:
            direct[x.name] = j
    last = {}
    for i, (_, _, uses, _, _) in enumerate(kept):
        for name in uses:
            last[name] = i
    for x in results:
        if isinstance(x, Traced):
            last[x.name] = len(kept)  # alive to the end
    free = {kind: [] for kind in _DTYPE}
    used = dict.fromkeys(_DTYPE, 0)
    slot: dict[str, tuple[str, int]] = {}

    def release(names, i):
        for name in names:
            if last.get(name) == i and name in slot:
                kind, row = slot.pop(name)
                free[kind].append(row)

    def allocate(kind: str) -> int:
        if free[kind]:
            return free[kind].pop()
        used[kind] += 1
        return used[kind] - 1

    text, body = tracer.text, []
    for i, (targets, expression, uses, op, kind) in enumerate(kept):
        if op is None or kind not in _DTYPE:  # numpy allocates (indices into tables)
            body.append(f"{', '.join(targets)} = {expression}")
            release(uses, i)
            continue
        target = targets[0]
        if target in direct:  # the caller's array (its own dtype: take casts through a copy)
            buffer = f"out[{direct[target]}]"
            release(uses, i)
            if op[0] == "take":
                body.append(
                    f"{target} = {buffer}; copyto({target}, take({text(op[1])}, {op[2].name}))"
                )
                continue
        else:
            elementwise = op[0] not in ("where", "take")
            if elementwise:  # an operand read for the last time may hold the result
                release(uses, i)
            row = allocate(kind)
            if not elementwise:
                release(uses, i)
            buffer = f"{kind.upper()}[{row}]"
            slot[target] = (kind, row)
        if op[0] == "where":
            cond, if_true, if_false = op[1:]
            body.append(
                f"{target} = {buffer}; copyto({target}, {text(if_false)}); "
                f"copyto({target}, {text(if_true)}, where={cond.name})"
            )
        elif op[0] == "take":
            body.append(f"{target} = take({text(op[1])}, {op[2].name}, out={buffer})")
        else:
            args = ", ".join(map(text, op[1:]))
            body.append(f"{target} = {op[0]}({args}, out={buffer})")
    first = next((name for name in tracer.inputs if name in last), None)
    sizes = [
        f"{kind.upper()} = scratch({kind!r}, {used[kind]}, n)" for kind in _DTYPE if used[kind]
    ]
    prologue = [f"n = len({first})", *sizes] if sizes else []
    return prologue + body, set(direct.values())
