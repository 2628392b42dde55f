"""A traced formula as native code: the same operations in C, called like the Python form.

:mod:`xbench.core.tracing` turns the predicate into a straight-line Python function of a
request, about 150-200 float operations for a profile of a few fabrics; CPython spends some
15 ns on each. A scheduler that asks per request wants the answer in well under a
microsecond, so a function that has been called often is built once more as a C extension
function (gcc and Python's headers, cached in :func:`xbench.native.cache_dir`): it reads the
request tuple's fields as doubles, runs the same operations in the same order with IEEE
doubles (no contraction into fused multiply-adds), and returns the same tuple.

Same bits as the Python form, by construction and by a test: every value that may be an
integer (a request's fields are ints) is checked to stay below 2**53, where a double holds
it exactly as Python's int does; a field that is not an exact ``int`` or ``float``, a
division by zero (a ZeroDivisionError in Python) or an integer past 2**53 hands the call to
the Python form. A line the C form cannot express (an operation on objects) leaves the
function in Python: :func:`build` returns None, as it does without gcc or headers.

``XBENCH_PREDICATE``: ``python`` keeps every function in Python; ``native`` builds on the
first call (tests, benchmarks); otherwise a function is built after :data:`AFTER_CALLS`
calls, so a one-off ``decide`` never waits for a compiler.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import math
import os
import shutil
import subprocess
import sysconfig
import tempfile
import types
from pathlib import Path
from string import Template

from xbench.core.tracing import _FLAG_OPS, _UFUNC, Traced, Tracer

AFTER_CALLS = 1000
EXACT = 2.0**53  # an integer below this is a double exactly
_CFLAGS = ("-O2", "-shared", "-fPIC", "-ffp-contract=off", "-fno-fast-math", "-w")
# a traced line names its operator by numpy's function (tracing's table); C spells it as
# Python does (& and | of flags: 0 or 1)
_INFIX = {function: symbol for symbol, function in _UFUNC.items()}
_COMPARE = {_UFUNC[symbol] for symbol in _FLAG_OPS if symbol not in ("&", "|")}


def mode() -> str:
    """``python``, ``native`` (build at once) or ``auto`` (after AFTER_CALLS calls)."""
    wanted = os.environ.get("XBENCH_PREDICATE", "auto")
    return wanted if wanted in ("python", "native") else "auto"


def available() -> bool:
    """Whether C forms can be built here: gcc on PATH and Python's headers (python3-dev)."""
    return shutil.which("gcc") is not None and _headers().exists()


def _headers() -> Path:
    return Path(sysconfig.get_paths()["include"]) / "Python.h"


def is_native(function) -> bool:
    """Whether ``function`` is a built C form (else the Python form, or still warming)."""
    return isinstance(function, types.BuiltinFunctionType)


class _Unsupported(Exception):
    """A line the C form does not express: the function stays in Python."""


def _double(x: float | int) -> str:
    if isinstance(x, int) and abs(x) >= EXACT:
        raise _Unsupported(f"integer constant {x}")
    x = float(x)
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "(-INFINITY)"
    return x.hex()  # exact: C99 reads hexadecimal floats


class _Emitter:
    """C text for the lines a result depends on. Each value has a C type: ``d`` double,
    ``b`` flag (int 0/1), ``n`` index (Py_ssize_t) or ``o`` object (a constant's
    PyObject*), and whether it may be an integer in Python (checked against 2**53)."""

    def __init__(self, tracer: Tracer, numpy: bool = False):
        # numpy: the array form's semantics (a division by zero is inf, a minimum of NaN
        # is NaN), every input a float64 or a flag; else Python's, with its fallbacks
        self.tracer, self.numpy = tracer, numpy
        self.objects: list = []  # the object constants, K[i] in C
        self.tables: list[str] = []  # static arrays
        self.types: dict[str, str] = {}
        self.integral: dict[str, bool] = {}
        self.body: list[str] = []

    def obj(self, value) -> str:
        for i, known in enumerate(self.objects):
            if type(known) is type(value) and known == value:
                return f"K[{i}]"
        self.objects.append(value)
        return f"K[{len(self.objects) - 1}]"

    def operand(self, x) -> tuple[str, str, bool]:
        """(C text, type, may be an integer)."""
        if isinstance(x, Traced):
            return x.name, self.types[x.name], self.integral[x.name]
        if type(x) is bool:
            return ("1" if x else "0"), "b", False
        if type(x) in (int, float):
            return _double(x), "d", type(x) is int
        if isinstance(x, str) or x is None:
            return self.obj(x), "o", False
        raise _Unsupported(f"constant {x!r}")

    def define(self, name: str, ctype: str, text: str, integral: bool = False) -> None:
        decl = {"d": "double", "b": "int", "n": "Py_ssize_t", "o": "PyObject *"}[ctype]
        self.body.append(f"{decl} {name} = {text};")
        self.types[name], self.integral[name] = ctype, integral
        if integral and ctype == "d" and not self.numpy:  # Python's int is exact: so here
            self.body.append(f"if (!(fabs({name}) < EXACT)) goto fallback;")

    def table(self, values: tuple) -> tuple[str, str, bool]:
        """A constant tuple as a static array: (its name, the elements' C type, integral)."""
        name = f"T{len(self.tables)}"
        if all(type(v) is bool for v in values):
            ctype, decl, items, integral = "b", "int", [str(int(v)) for v in values], False
        elif all(type(v) in (int, float) for v in values):
            integral = any(type(v) is int for v in values)
            ctype, decl, items = "d", "double", [_double(v) for v in values]
        elif all(isinstance(v, str) or v is None for v in values):  # slots in K
            ctype, decl, items, integral = "o", "int", [self.obj(v)[2:-1] for v in values], False
        else:
            raise _Unsupported(f"table {values!r}")
        self.tables.append(f"static const {decl} {name}[] = {{{', '.join(items)}}};")
        return name, ctype, integral

    def lines(self, kept: list) -> None:
        """C for each of the traced lines ``kept`` (tracer.kept), in order."""
        for targets, _, _, op, _ in kept:
            if op is None:
                raise _Unsupported("a line without its operation")
            self.line(targets, op)

    def line(self, targets: tuple, op: tuple) -> None:
        kind, args = op[0], op[1:]
        if kind in _INFIX:
            self._infix(targets[0], kind, *args)
        elif kind == "negative":
            text, ctype, integral = self.operand(args[0])
            if ctype != "d" or integral:  # -0 is 0 for an int, -0.0 for a double
                raise _Unsupported("negative of an integer")
            self.define(targets[0], "d", f"-{text}")
        elif kind == "expm1":
            text, ctype, _ = self.operand(args[0])
            self.define(targets[0], "d", f"expm1({text})")
        elif kind == "where":
            self._where(targets[0], *args)
        elif kind == "bisect_right":
            self._bisect(targets[0], *args)
        elif kind == "row":  # a piece's coefficients, one column each
            pieces, index = args
            for target, column in zip(targets, zip(*pieces, strict=True), strict=True):
                self._take(target, column, index)
        elif kind == "take":
            self._take(targets[0], *args)
        elif kind in ("minimum", "maximum"):  # numpy's: NaN if either is NaN
            (ta, _, ia), (tb, _, ib) = self.operand(args[0]), self.operand(args[1])
            pick = "<=" if kind == "minimum" else ">="
            text = f"{ta} != {ta} ? {ta} : {tb} != {tb} ? {tb} : {ta} {pick} {tb} ? {ta} : {tb}"
            self.define(targets[0], "d", text, ia and ib)
        else:
            raise _Unsupported(kind)

    def _infix(self, target: str, kind: str, a, b) -> None:
        (ta, ca, ia), (tb, cb, ib) = self.operand(a), self.operand(b)
        if "o" in (ca, cb) or "n" in (ca, cb):
            raise _Unsupported(f"{kind} of objects")
        symbol = _INFIX[kind]
        if kind in ("logical_and", "logical_or"):
            if (ca, cb) != ("b", "b"):
                raise _Unsupported(f"{kind} of numbers")
            self.define(target, "b", f"{ta} {symbol} {tb}")
        elif kind in _COMPARE:
            self.define(target, "b", f"{ta} {symbol} {tb}")
        elif kind == "true_divide":
            if not self.numpy:
                self.body.append(f"if ({tb} == 0) goto fallback;")  # Python raises
            self.define(target, "d", f"(double){ta} / {tb}")
        else:  # bools count as integers in Python's arithmetic
            integral = (ia or ca == "b") and (ib or cb == "b")
            self.define(target, "d", f"(double){ta} {symbol} {tb}", integral)

    def _where(self, target: str, cond, if_true, if_false) -> None:
        tc, cc, _ = self.operand(cond)
        (ta, ca, ia), (tb, cb, ib) = self.operand(if_true), self.operand(if_false)
        if cc != "b":
            raise _Unsupported("a choice on a number")
        if (ca == "o") != (cb == "o") or "n" in (ca, cb):
            raise _Unsupported("a choice between an object and a number")
        ctype = "o" if ca == "o" else "b" if ca == cb == "b" else "d"
        integral = ctype == "d" and (ia or ib or "b" in (ca, cb))
        self.define(target, ctype, f"{tc} ? {ta} : {tb}", integral)

    def _bisect(self, target: str, breaks: tuple, x) -> None:
        """bisect.bisect_right, CPython's loop: the first index whose value exceeds x."""
        if not breaks:  # one piece
            self.define(target, "n", "0")
            return
        name, ctype, _ = self.table(tuple(breaks))
        tx, cx, _ = self.operand(x)
        if ctype != "d" or cx != "d":
            raise _Unsupported("bisect of objects")
        self.define(target, "n", "0")
        self.body.append(
            f"{{ Py_ssize_t hi = {len(breaks)}; while ({target} < hi) {{ "
            f"Py_ssize_t mid = ({target} + hi) / 2; "
            f"if ({tx} < {name}[mid]) hi = mid; else {target} = mid + 1; }} }}"
        )

    def _take(self, target: str, table: tuple, index) -> None:
        name, ctype, integral = self.table(tuple(table))
        ti, ci, _ = self.operand(index)
        if ci == "o":
            raise _Unsupported("an index that is an object")
        slot = f"{target}_at"
        size = len(table)
        # Python's negative index counts from the end
        self.body.append(f"Py_ssize_t {slot} = (Py_ssize_t){ti};")
        self.body.append(f"if ({slot} < 0) {slot} += {size};")
        self.body.append(f"if ({slot} < 0 || {slot} >= {size}) goto fallback;")
        value = f"K[{name}[{slot}]]" if ctype == "o" else f"{name}[{slot}]"
        self.define(target, ctype, value, integral)

    def result(self, x) -> str:
        """A new reference to the Python value of result ``x``."""
        text, ctype, integral = self.operand(x)
        if ctype == "o":
            return f"Py_NewRef({text})"
        if ctype == "b":
            return f"PyBool_FromLong({text})"
        if ctype == "n":
            return f"PyLong_FromSsize_t({text})"
        if integral:  # an int in Python: the C form would hand back a float
            raise _Unsupported("an integer result")
        return f"PyFloat_FromDouble({text})"


# The C texts (string.Template: C's braces stay as they are). A module per function, named
# by a hash of its text; its one function reads the request tuple (the scalar form) or the
# arrays of a block (the block form, the GIL released while it runs).
_HEAD = """#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#define EXACT 9007199254740992.0
"""
_SCALAR = Template(
    _HEAD
    + """static PyObject *K[$objects];
static PyObject *FALLBACK;
$tables

static PyObject *predicate(PyObject *self, PyObject *r) {
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != $fields) goto fallback;
$body
    {
    PyObject *out = PyTuple_New($results);
    if (out == NULL) return NULL;
$fill
    return out;
    }
fallback:
    return PyObject_CallOneArg(FALLBACK, r);
}

static PyObject *setup(PyObject *self, PyObject *args) {
    PyObject *constants, *fallback;
    if (!PyArg_ParseTuple(args, "O!O", &PyTuple_Type, &constants, &fallback)) return NULL;
    if (PyTuple_GET_SIZE(constants) != $constants) {
        PyErr_SetString(PyExc_ValueError, "wrong number of constants");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < $constants; i++)
        Py_XSETREF(K[i], Py_NewRef(PyTuple_GET_ITEM(constants, i)));
    Py_XSETREF(FALLBACK, Py_NewRef(fallback));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"predicate", predicate, METH_O, NULL},
    {"setup", setup, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};
static struct PyModuleDef definition = {PyModuleDef_HEAD_INIT, "$module", NULL, -1, methods};
PyMODINIT_FUNC PyInit_$module(void) { return PyModule_Create(&definition); }
"""
)
_BLOCK = Template(
    _HEAD
    + """static PyObject *K[1];
$tables

static int rows(const void **in, void **out, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
$body
    }
    return 0;
fallback:
    return 1;
}

static const Py_ssize_t ITEM_IN[] = {$item_in};
static const Py_ssize_t ITEM_OUT[] = {$item_out};

static PyObject *block(PyObject *self, PyObject *args) {
    PyObject *inputs, *outputs;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "O!O!n", &PyTuple_Type, &inputs, &PyTuple_Type, &outputs, &n))
        return NULL;
    if (PyTuple_GET_SIZE(inputs) != $n_in || PyTuple_GET_SIZE(outputs) != $n_out) {
        PyErr_SetString(PyExc_ValueError, "wrong number of arrays");
        return NULL;
    }
    Py_buffer views[$views];
    const void *in[$in_slots];
    void *out[$n_out];
    int held = 0, status = 2;
    for (; held < $views; held++) {
        int writing = held >= $n_in;
        PyObject *array = writing ? PyTuple_GET_ITEM(outputs, held - $n_in)
                                  : PyTuple_GET_ITEM(inputs, held);
        Py_ssize_t item = writing ? ITEM_OUT[held - $n_in] : ITEM_IN[held];
        int flags = PyBUF_C_CONTIGUOUS | (writing ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(array, &views[held], flags) < 0) goto done;
        if (views[held].len < n * item) {
            PyErr_SetString(PyExc_ValueError, "an array shorter than the block");
            held++;
            goto done;
        }
        if (writing) out[held - $n_in] = views[held].buf; else in[held] = views[held].buf;
    }
    Py_BEGIN_ALLOW_THREADS
    status = rows(in, out, n);
    Py_END_ALLOW_THREADS
done:
    for (int k = 0; k < held; k++) PyBuffer_Release(&views[k]);
    if (status == 2) return NULL;
    return PyLong_FromLong(status);
}

static PyMethodDef methods[] = {
    {"block", block, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};
static struct PyModuleDef definition = {PyModuleDef_HEAD_INIT, "$module", NULL, -1, methods};
PyMODINIT_FUNC PyInit_$module(void) { return PyModule_Create(&definition); }
"""
)


def c_source(tracer: Tracer, fields: tuple, results: tuple, module: str) -> tuple[str, tuple]:
    """The C extension's text for ``results`` of a traced function of ``fields``, and the
    object constants its ``setup`` takes. _Unsupported where a line has no C form."""
    kept, needed = tracer.kept(results)
    emit = _Emitter(tracer)
    reads = []
    for i, field in enumerate(fields):
        if field not in needed:
            continue
        item = f"PyTuple_GET_ITEM(r, {i})"
        reads.append(
            f"double {field}; {{ PyObject *o = {item}; "
            f"if (PyFloat_CheckExact(o)) {field} = PyFloat_AS_DOUBLE(o); "
            f"else if (PyLong_CheckExact(o)) {{ {field} = PyLong_AsDouble(o); "
            f"if ({field} == -1.0 && PyErr_Occurred()) {{ PyErr_Clear(); goto fallback; }} "
            f"if (!(fabs({field}) < EXACT)) goto fallback; }} "
            "else goto fallback; }"
        )
        emit.types[field], emit.integral[field] = "d", True  # an int, for all it knows
    emit.lines(kept)
    returned = [emit.result(x) for x in results]
    fill = "\n".join(
        f"    PyTuple_SET_ITEM(out, {j}, {value});" for j, value in enumerate(returned)
    )
    objects = max(1, len(emit.objects))
    body = "\n".join(f"    {line}" for line in (*reads, *emit.body))
    text = _SCALAR.substitute(
        tables="\n".join(emit.tables), objects=objects, constants=len(emit.objects),
        fields=len(fields), body=body, results=len(returned), fill=fill, module=module,
    )  # fmt: skip
    return text, tuple(emit.objects)


_OUT_C = {"int8": "signed char", "int16": "short", "float64": "double", "bool": "unsigned char"}


def block_source(tracer: Tracer, fields: tuple, results: tuple, dtypes: tuple, module: str):
    """The C extension's text for a traced array form (numpy blocks): ``block(inputs,
    outputs, n)`` runs the lines row by row over ``fields``' float64 or flag arrays into
    the output arrays of ``dtypes`` (numpy names), the GIL released; it returns 1 where a
    row needs the numpy form (an index out of its table), else 0."""
    kept, needed = tracer.kept(results)
    emit = _Emitter(tracer, numpy=True)
    reads = []
    for i, field in enumerate(fields):
        if field not in needed:
            continue
        flag = tracer.kinds[field] == "b"
        ctype = "const unsigned char" if flag else "const double"
        reads.append(f"{'int' if flag else 'double'} {field} = (({ctype} *)in[{i}])[i];")
        emit.types[field], emit.integral[field] = ("b" if flag else "d"), False
    emit.lines(kept)
    if emit.objects:  # the block form keeps no object constants (K holds none there)
        raise _Unsupported("an object in a block")
    writes = []
    for j, (x, dtype) in enumerate(zip(results, dtypes, strict=True)):
        text, ctype, _ = emit.operand(x)
        if ctype in ("o", "n") or dtype not in _OUT_C:
            raise _Unsupported(f"result {j} of type {ctype} into {dtype}")
        value = f"({text}) != 0" if dtype == "bool" else text
        writes.append(f"(({_OUT_C[dtype]} *)out[{j}])[i] = ({_OUT_C[dtype]})({value});")
    body = "\n".join(f"        {line}" for line in (*reads, *emit.body, *writes))
    item = {"int8": 1, "bool": 1, "int16": 2, "float64": 8}
    return _BLOCK.substitute(
        tables="\n".join(emit.tables), body=body, n_in=len(fields), n_out=len(results),
        views=len(fields) + len(results), in_slots=max(len(fields), 1),
        item_in=", ".join("1" if tracer.kinds[f] == "b" else "8" for f in fields) or "0",
        item_out=", ".join(str(item[d]) for d in dtypes), module=module,
    )  # fmt: skip


def build_block(tracer: Tracer, fields: tuple, results: tuple, dtypes: tuple, numpy_form):
    """The C form of a traced array form, called as ``numpy_form`` is (``(block, out)``,
    every result into ``out``); a block the C form hands back runs in ``numpy_form``.
    None where there is no C form (as :func:`build`)."""
    try:
        text = block_source(tracer, fields, results, dtypes, "MODULE")
    except _Unsupported:
        return None
    extension = _load(text, ())
    if extension is None:
        return None
    rows = extension.block

    def block(columns, out):
        if rows(tuple(columns), tuple(out), len(out[0])):
            return numpy_form(columns, out)
        return (None,) * len(out)

    return block


def build(tracer: Tracer, fields: tuple, results: tuple, python):
    """The C form of the traced function (``python`` serves what it hands back), or None
    where it has no C form, gcc or Python's headers are missing, or gcc fails."""
    try:
        text, objects = c_source(tracer, fields, results, "MODULE")
    except _Unsupported:
        return None
    extension = _load(text, objects)
    if extension is None:
        return None
    # one module per text and constants: a second profile with the same ones shares it,
    # and either's Python form answers its fallbacks the same
    extension.setup(objects, python)
    return extension.predicate


def _load(text: str, objects: tuple):
    """The extension module of ``text`` (``MODULE`` standing for its name), built once and
    cached; None without gcc or Python's headers, or where gcc fails."""
    if not available():
        return None
    key = text + repr(objects) + " ".join(_CFLAGS) + sysconfig.get_config_var("SOABI")
    module = f"xbench_predicate_{hashlib.sha256(key.encode()).hexdigest()[:20]}"
    text = text.replace("MODULE", module)
    from xbench.native import cache_dir

    target = cache_dir() / f"{module}{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not target.exists() and not _compile(text, target, _headers().parent):
        return None
    loader = importlib.machinery.ExtensionFileLoader(module, str(target))
    spec = importlib.util.spec_from_file_location(module, target, loader=loader)
    extension = importlib.util.module_from_spec(spec)
    loader.exec_module(extension)
    return extension


def _compile(text: str, target: Path, include: Path) -> bool:
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        source, built = Path(tmp, "predicate.c"), Path(tmp, target.name)
        source.write_text(text)
        done = subprocess.run(
            ["gcc", *_CFLAGS, f"-I{include}", "-o", str(built), str(source)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            return False
        os.replace(built, target)  # whole or not at all, for a process beside this one
    return True
