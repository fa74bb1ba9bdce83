"""A learner's CUDA kernel, checked in a process that holds that kernel alone.

A kernel check traces the kernel: it runs the kernel's Python code thread by thread and records
every memory access, and the report is what the check judges. Run in the learner's process, that
report could be forged; so grading rebuilds the kernel elsewhere, from the notebook's source as the
grader read it:

1. The answerer (in the sandbox) says which statement of the notebook defined the kernel and each
   device function it calls, and what the other names they look up are: a module, or a plain value
   (a number, a tuple, an array). Nothing it says is code.
2. The grader takes those functions' `def`s from its own copy of the notebook, without their
   decorators and annotations, with constant defaults only, so that defining them runs nothing.
3. A fresh process (`main`, started from `remote.BOOT`) defines them among those modules (only
   `math`, `cmath`, `numpy`, `numba` and `numba.cuda`) and values, compiles the kernel for a GPU
   with numba in nopython mode before each launch (which admits no imports and no Python objects:
   a kernel that compiles can only compute), and only then runs the check, tracer and all. It sends
   the verdict on a pipe of its own: nothing the kernel prints can pass for it.
"""

import ast
import builtins
import importlib
import json
import os

from . import wire

MODULES = ("math", "cmath", "numpy", "numba", "numba.cuda")
PR_SET_DUMPABLE = 4


class Refused(Exception):
    """The kernel cannot be rebuilt from the notebook's source as described."""


def _plain(value):
    """Whether a decoded value is data a kernel may read: numbers, tuples of them, arrays, dtypes."""
    import numpy as np

    if value is None or isinstance(value, (bool, int, float, complex, str, np.generic, np.ndarray, np.dtype)):
        return not isinstance(value, np.ndarray) or not value.dtype.hasobject
    if isinstance(value, type) and issubclass(value, np.generic):
        return True
    return isinstance(value, tuple) and all(_plain(v) for v in value)


def bundle(description, statements):
    """What the kernel's process needs, from the answerer's description and the grader's own copy
    of the statements: {"kernel", "defs": [[name, source, device]], "modules", "values"}."""
    kernel, functions = description.get("kernel"), description.get("functions")
    if not isinstance(kernel, str) or not isinstance(functions, dict) or kernel not in functions:
        raise Refused(description.get("why") or "no kernel was found in the notebook")
    defs = []
    for name, where in functions.items():
        if not (isinstance(where, list) and len(where) == 2 and type(where[0]) is int
                and 0 <= where[0] < len(statements)):
            raise Refused(f"no statement defines {name}")
        tree = ast.parse(statements[where[0]])
        found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
        if not found:
            raise Refused(f"{name} is not defined by a `def` of the notebook")
        node = found[-1]
        node.decorator_list, node.returns = [], None
        arguments = node.args
        for arg in arguments.posonlyargs + arguments.args + arguments.kwonlyargs + [arguments.vararg, arguments.kwarg]:
            if arg is not None:
                arg.annotation = None
        if not all(isinstance(d, ast.Constant) for d in arguments.defaults + [d for d in arguments.kw_defaults if d]):
            raise Refused(f"{name} has a default value that is not a constant")
        defs.append([name, ast.unparse(node), bool(where[1]) and name != kernel])
    modules, values = {}, {}
    codec = wire.Codec("a")
    for name, (kind, *rest) in description.get("globals", {}).items():
        if kind == "module":
            if rest[0] not in MODULES:
                raise Refused(f"a kernel may use the modules {', '.join(MODULES)}, not {rest[0]} (as {name})")
            modules[name] = rest[0]
        elif kind == "value":
            value = codec.decode(rest[0])
            if not _plain(value):
                raise Refused(f"{name} is a {type(value).__name__}: a kernel reads numbers, tuples and arrays")
            values[name] = rest[0]
        elif kind == "numba":
            values[name] = ["numba", str(rest[0])]
        elif kind == "unknown":
            raise Refused(f"{name} is a {rest[0]}: a kernel reads numbers, tuples and arrays")
    return {"kernel": kernel, "defs": defs, "modules": modules, "values": values}


def _define(job):
    """The kernel (a @cuda.jit function) rebuilt from the bundle, its device functions beside it."""
    from numba import cuda

    space = {"__name__": "__notebook__", "__builtins__": builtins}
    for name, module in job["modules"].items():
        if module not in MODULES:
            raise Refused(f"no module {module}")
        space[name] = importlib.import_module(module)
    codec = wire.Codec("b")
    for name, data in job["values"].items():
        if data[0] == "numba":  # one of numba's scalar types, by its name
            import numba
            from numba.core import types as nbtypes

            value = getattr(numba, data[1], None) if data[1].isidentifier() else None
            if not isinstance(value, nbtypes.Type):
                raise Refused(f"{name} is not one of numba's types")
            space[name] = value
            continue
        value = codec.decode(data)
        if not _plain(value):
            raise Refused(f"{name} is not plain data")
        space[name] = value
    for name, source, device in job["defs"]:
        tree = ast.parse(source)
        if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef) or tree.body[0].decorator_list:
            raise Refused(f"{name} is not a plain def")
        exec(compile(tree, f"<notebook {name}>", "exec"), space)  # defines it; runs none of its body
    for name, _, device in job["defs"]:
        if device:
            space[name] = cuda.jit(device=True)(space[name])
    return cuda.jit(space[job["kernel"]])


def main(job, root):
    """The kernel's own process: rebuild it, check it with the compile-first tracer, report on the
    pipe the grader gave."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    out = job["report_fd"]
    try:
        from course.exercises import _core, part6

        part6.COMPILE_FIRST = True  # every launch compiled for a GPU before the tracer runs it
        kernel = _define(job)
        result = _core.run(job["id"], kernel, gate=False, fresh=job["seed"])
        report = [result.status, result.message]
    except Refused as err:
        report = ["failed", f"[{job['id']}] failed: {err}"]
    except BaseException as err:  # noqa: BLE001 - the grader gets a row whatever happened
        report = ["failed", f"[{job['id']}] failed: the kernel could not be checked ({type(err).__name__}: {err})"]
    os.write(out, json.dumps(report).encode())
    os.close(out)
    os._exit(0)  # the tracer's threads and the compiling process are not waited for
