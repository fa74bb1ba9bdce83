"""Values as plain data, and back: one side's half of what crosses between two processes.

Everything that crosses is JSON and `.npy` bytes; never pickle, so decoding never runs code of the
sender's choosing:

- numbers, strings, bytes, None, lists, tuples, dicts, sets, slices, NumPy arrays (`.npy` with
  `allow_pickle=False`) and scalars, NumPy random generators (their state), dtypes;
- objects of the course's lesson modules (a Value, a Tensor, a Module, a graph node), as their
  class's name and their fields; the functions the course's code made (a Value's `_backward`
  closure) as the place of that code and the values it closed over. The receiver rebuilds them
  from its own copy of the course: code never travels;
- anything else (a function the learner wrote, an object of the learner's class, a function of
  the check) stays where it is and travels as a handle: the other side gets a `Remote` whose
  calls, item and attribute reads are requests to the owner (`wire.Channel` carries them).

Both sides keep a table of the mutable objects that have crossed (by a number each side agrees
on), so an object sent twice is the same object on arrival, a graph keeps its shared nodes, and
what a call changed in its arguments is sent back and applied to the originals.
"""

import base64
import hashlib
import builtins
import contextlib
import gc
import io
import math
import sys
import types

import numpy as np

# The modules whose classes and functions travel by name and are rebuilt on arrival: the lessons'
# engines. Not the exercises' checks, not grading, not the tools around the lessons.
LESSON_MODULES = ("course.micrograd", "course._graph", "course.tensor", "course.nn", "course.optim",
                  "course.minitf", "course.gpt", "course.mamba", "course.kernels", "course.data",
                  "course.train", "course.sampling")
# Functions of these modules travel by name too (math.sin, np.exp): they are pure and the same on
# both sides. Only names reached as an attribute of the module itself are looked up.
PURE_MODULES = {"math": math, "numpy": np}
PURE_BUILTINS = {"abs", "min", "max", "sum", "len", "round", "pow", "float", "int", "bool", "str", "list",
                 "tuple", "dict", "set", "sorted", "reversed", "range", "zip", "enumerate", "map", "filter",
                 "isinstance", "repr", "divmod", "all", "any"}


class WireError(Exception):
    """What was sent cannot cross (a type with no plain form) or what arrived is not well formed."""


_LESSON = {}


def _is_lesson(module):
    known = _LESSON.get(module)
    if known is None:
        known = _LESSON[module] = any(module == m or module.startswith(m + ".") for m in LESSON_MODULES)
    return known


def _lookup(dotted):
    """The lesson-module object at "module:qualname" (a class or a module-level function), or an error."""
    module, _, qualname = dotted.partition(":")
    if not _is_lesson(module):
        raise WireError(f"{module} is not a lesson module")
    obj = sys.modules.get(module)  # never imported here: only what this side loaded already
    if obj is None:
        raise WireError(f"{module} is not loaded")
    for part in qualname.split("."):
        if part.startswith("__") or part == "<locals>":
            raise WireError(f"no plain name {dotted}")
        obj = getattr(obj, part, None)
    # Only what the lesson module itself defines under that name: not what it imported (os.system).
    if obj is None or getattr(obj, "__module__", None) != module or getattr(obj, "__qualname__", None) != qualname:
        raise WireError(f"no lesson object {dotted}")
    return obj


_NAMES = {}  # id(class) -> (class, its name or None): every object of a class asks


def _name_of(obj):
    """"module:qualname" when `obj` can be found again by that name in a lesson module, else None."""
    if isinstance(obj, type):
        known = _NAMES.get(id(obj))
        if known is not None and known[0] is obj:
            return known[1]
        name = _find_name(obj)
        _NAMES[id(obj)] = (obj, name)
        return name
    return _find_name(obj)


def _find_name(obj):
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or not _is_lesson(module):
        return None
    if "<locals>" in qualname:
        return None
    try:
        return f"{module}:{qualname}" if _lookup(f"{module}:{qualname}") is obj else None
    except (WireError, ImportError):
        return None


_FIELDS = {}


def _fields(cls):
    """The names of an instance's slots, over its class's ancestry."""
    known = _FIELDS.get(cls)
    if known is None:
        known = _FIELDS[cls] = _slots(cls)
    return known


def _slots(cls):
    names = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names += [slots] if isinstance(slots, str) else [s for s in slots if s not in ("__dict__", "__weakref__")]
    return names


_INDEX = {}


def _code_index(module):
    """{code object: (path of names, first line)} for every function a lesson module defines, at
    any depth: module functions, methods, and the functions nested in them (closures)."""
    mod = sys.modules.get(module)
    if mod is None:
        return {}
    cached = _INDEX.get(module)
    if cached is not None and cached[0] is mod:
        return cached[1]
    index, todo, seen = {}, [((), v) for v in vars(mod).values()], set()
    while todo:
        path, obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, type) and obj.__module__ == module:
            todo += [((*path, obj.__name__), v) for v in vars(obj).values()]
            continue
        obj = getattr(obj, "__func__", obj)  # classmethod, staticmethod
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if isinstance(obj, property):
            todo += [(path, f) for f in (obj.fget, obj.fset) if f is not None]
            continue
        code = obj if isinstance(obj, types.CodeType) else getattr(obj, "__code__", None)
        if not isinstance(code, types.CodeType) or (not isinstance(obj, types.CodeType)
                                                     and getattr(obj, "__module__", None) != module):
            continue
        here = (*path, code.co_name)
        index.setdefault(code, (here, code.co_firstlineno))
        todo += [(here, c) for c in code.co_consts if isinstance(c, types.CodeType)]
    _INDEX[module] = (mod, index)
    return index


def _code_path(code, module):
    found = _code_index(module).get(code)
    return list(found[0]) if found else None


_PLACES = {}  # module -> (its index, {(path, first line): code})


def _find_code(module, path, line):
    index = _code_index(module)
    known = _PLACES.get(module)
    if known is None or known[0] is not index:
        known = _PLACES[module] = (index, {(tuple(where), first): code for code, (where, first) in index.items()})
    if not isinstance(path, list) or not all(isinstance(p, str) for p in path):
        return None
    return known[1].get((tuple(path), line))


def _npy(array):
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _from_npy(text):
    return np.load(io.BytesIO(base64.b64decode(text)), allow_pickle=False)


@contextlib.contextmanager
def _no_collection():
    """Python's cycle collector paused while a message is taken apart or put together: a graph of
    100,000 nodes makes that many containers, and each pass of the collector walks all of them."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Codec:
    """One side's half of a channel: its table of shared objects and of the handles it lent out.

    A message is flat: ["x", [[number, body], ...], value], every object with an identity (a list,
    a dict, a set, an array, a course object, a course closure) defined once in the list and
    referred to by its number everywhere else, so a 100,000-node graph is a long list, not a deep
    nest, and encoding or decoding it never recurses."""

    def __init__(self, side):
        self.side = side          # "a" or "b": whose numbers and handles are whose
        self.objects = {}         # wire number -> object, both sides agree on these
        self.numbers = {}         # id(object) -> wire number
        self.lent = {}            # handle number -> object of ours the other side holds a Remote of
        self.lent_ids = {}
        self.remotes = {}         # handle number -> Remote of the other side's object
        self.touched = set()      # numbers decoded since the last reset: what a request reached
        self.synced = {}          # number -> what the object held when the two sides last agreed on it
        self.channel = None
        self._next = 0
        self._queue = []
        self._classes = {}        # "module:qualname" -> class, once looked up

    def _adopt(self, n, obj):
        old = self.objects.get(n)
        if old is not None and old is not obj:
            self.numbers.pop(id(old), None)
        self.objects[n], self.numbers[id(obj)] = obj, n

    # ---- encoding ----

    def encode(self, value):
        """A message holding `value`: the objects it reaches that the other side has not seen, and
        the contents of those it has seen that changed here since (a list the learner's code
        mutated between two calls that pass it)."""
        with _no_collection():
            root = self._enc(value)
            defs = self._drain([])
            sent = {n for n, _ in defs}
            for n in sorted(_reached(self, value) - sent):
                if not _same(self.synced.get(n), _snapshot(self.objects[n])):
                    defs.append([n, self._sync(n)])
            return ["x", self._drain(defs), root]

    def states(self, numbers):
        """The current contents of the shared objects `numbers` (and any new object they hold)."""
        with _no_collection():
            defs = [[n, self._sync(n)] for n in numbers if n in self.objects]
            return ["x", self._drain(defs), None]

    def _sync(self, n):
        obj = self.objects[n]
        self.synced[n] = _snapshot(obj)
        return self._body(obj)

    def _drain(self, defs):
        while self._queue:
            n, obj = self._queue.pop()
            defs.append([n, self._sync(n) if self.objects.get(n) is obj else self._body(obj)])
        return defs

    def _ref(self, v):
        n = self.numbers.get(id(v))
        if n is not None and self.objects.get(n) is v:
            return ["r", n]
        n = f"{self.side}{self._next}"
        self._next += 1
        self._adopt(n, v)
        self._queue.append((n, v))
        return ["r", n]

    def _enc(self, v):
        if v is None or isinstance(v, (bool, str)) or type(v) is int:
            return v
        t = type(v)
        if t is float:
            return v if math.isfinite(v) else ["F", repr(v)]
        if t in (list, dict, set, np.ndarray, np.random.Generator):
            if t is np.ndarray and v.dtype.hasobject:
                return self._ref(list(v.ravel()))
            return self._ref(v)
        known = _NAMES.get(id(t))
        if known is not None and known[0] is t and known[1] and not issubclass(t, BaseException):
            return self._ref(v)  # an object of a lesson class (a Value, a Tensor, a node)
        if t is tuple:
            return ["t", [self._enc(x) for x in v]]
        if t is frozenset:
            return ["fs", [self._enc(x) for x in v]]
        if t is bytes:
            return ["b", base64.b64encode(v).decode("ascii")]
        if t is complex:
            return ["j", self._enc(v.real), self._enc(v.imag)]
        if t is slice:
            return ["sl", self._enc(v.start), self._enc(v.stop), self._enc(v.step)]
        if v is Ellipsis:
            return ["E"]
        if isinstance(v, np.generic) and t.__module__ == "numpy":
            return ["n", _npy(np.asarray(v))]
        if isinstance(v, np.dtype):
            return ["dt", v.str]
        if isinstance(v, types.ModuleType) and v.__name__ in PURE_MODULES:
            return ["M", v.__name__]
        if isinstance(v, Remote) and v._codec is self:
            return ["h", v._owner, v._number]
        if isinstance(v, type):
            if v.__module__ == "builtins" and v.__name__ in PURE_BUILTINS | {"object"}:
                return ["B", v.__name__]
            if issubclass(v, np.generic) and getattr(np, v.__name__, None) is v:
                return ["P", "numpy", v.__name__]
            name = _name_of(v)
            return ["c", name] if name else self._handle(v)
        if isinstance(v, (types.BuiltinFunctionType, np.ufunc)):
            name = getattr(v, "__name__", None)
            if getattr(v, "__module__", None) == "builtins" and name in PURE_BUILTINS:
                return ["B", name]
            if isinstance(v, np.ufunc) and getattr(np, name, None) is v:
                return ["P", "numpy", name]
            if name and getattr(math, name, None) is v:
                return ["P", "math", name]
            return self._handle(v)
        if isinstance(v, types.FunctionType):
            name = _name_of(v)
            if name:
                return ["c", name]
            if _is_lesson(v.__module__ or "") and _code_path(v.__code__, v.__module__) is not None:
                return self._ref(v)  # a closure the course's own code made (a Value's _backward)
            return self._handle(v)
        if isinstance(v, types.MethodType) and not isinstance(v.__self__, type):
            if _name_of(type(v.__self__)) and _is_lesson(getattr(v.__func__, "__module__", "") or ""):
                return ["m", self._enc(v.__self__), v.__func__.__name__]
            return self._handle(v)
        if not isinstance(v, BaseException) and _name_of(t):
            return self._ref(v)
        return self._handle(v)

    def _body(self, v):
        t = type(v)
        if t is list:
            return ["l", [self._enc(x) for x in v]]
        if t is dict:
            return ["d", [[self._enc(k), self._enc(x)] for k, x in v.items()]]
        if t is set:
            return ["s", [self._enc(x) for x in v]]
        if t is np.ndarray:
            return ["a", _npy(np.ascontiguousarray(v) if v.ndim else v)]
        if t is np.random.Generator:
            return ["g", type(v.bit_generator).__name__, self._enc(v.bit_generator.state)]
        if isinstance(v, types.FunctionType):
            cells = [self._enc(c.cell_contents) if _cell_full(c) else ["U"] for c in v.__closure__ or ()]
            path = _code_path(v.__code__, v.__module__)
            return ["k", v.__module__, path, v.__code__.co_firstlineno, cells, self._enc(v.__defaults__)]
        state = {f: getattr(v, f) for f in _fields(t) if hasattr(v, f)}
        state.update(vars(v) if hasattr(v, "__dict__") else {})
        return ["o", _name_of(t), [[k, self._enc(x)] for k, x in state.items()]]

    def _handle(self, v):
        n = self.lent_ids.get(id(v))
        if n is not None and self.lent.get(n) is v:
            return ["h", self.side, n]
        n = f"{self.side}h{len(self.lent)}"
        self.lent[n], self.lent_ids[id(v)] = v, n
        return ["h", self.side, n]

    # ---- decoding ----

    def decode(self, data):
        with _no_collection():
            return self._decode(data)

    def _decode(self, data):
        if not (isinstance(data, list) and len(data) == 3 and data[0] == "x" and isinstance(data[1], list)):
            raise WireError("not a message")
        defs = data[1]
        for item in defs:  # first every object, empty (or the one of that number already here)
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                    and isinstance(item[1], list) and item[1]):
                raise WireError("not an object definition")
            self._shell(*item)
        order = {"o": 0, "k": 1, "l": 2, "d": 3, "s": 4}
        for n, body in sorted(defs, key=lambda item: order.get(item[1][0], 5)):
            self._fill(self.objects[n], body)
        for n, _ in defs:
            self.synced[n] = _snapshot(self.objects[n])
        return self._val(data[2])

    apply = decode

    def _shell(self, n, body):
        tag, old = body[0], self.objects.get(n)
        self.touched.add(n)
        if tag in ("l", "d", "s"):
            empty = {"l": list, "d": dict, "s": set}[tag]
            obj = old if type(old) is empty else empty()
        elif tag == "a":
            array = _from_npy(body[1])
            obj = array
            if isinstance(old, np.ndarray) and old.shape == array.shape and old.dtype == array.dtype \
                    and old.flags.writeable:
                old[...] = array
                obj = old
        elif tag == "g":
            kinds = {"PCG64": np.random.PCG64, "PCG64DXSM": np.random.PCG64DXSM, "MT19937": np.random.MT19937,
                     "Philox": np.random.Philox, "SFC64": np.random.SFC64}
            if body[1] not in kinds:
                raise WireError(f"no random generator {body[1]}")
            obj = old if type(old) is np.random.Generator else np.random.Generator(kinds[body[1]]())
        elif tag == "k":
            code = _find_code(body[1], body[2], body[3])
            if code is None:
                raise WireError(f"no code {body[2]} in {body[1]}")
            if len(body[4]) != len(code.co_freevars):
                raise WireError(f"{code.co_name} closes over {len(code.co_freevars)} values, not {len(body[4])}")
            if isinstance(old, types.FunctionType) and old.__code__ is code:
                obj = old
            else:
                obj = types.FunctionType(code, vars(sys.modules[body[1]]), code.co_name, None,
                                         tuple(types.CellType() for _ in code.co_freevars) or None)
        elif tag == "o":
            cls = self._classes.get(body[1])
            if cls is None:
                cls = _lookup(body[1])
                if not isinstance(cls, type) or issubclass(cls, BaseException):
                    raise WireError(f"{body[1]} is not a class")
                self._classes[body[1]] = cls
            obj = old if type(old) is cls else cls.__new__(cls)
        else:
            raise WireError(f"unknown object tag {tag!r}")
        self._adopt(n, obj)

    def _fill(self, obj, body):
        tag = body[0]
        if tag == "l":
            obj[:] = [self._val(x) for x in body[1]]
        elif tag == "d":
            items = [(self._key(self._val(k)), self._val(x)) for k, x in body[1]]
            obj.clear()
            obj.update(items)
        elif tag == "s":
            items = [self._key(self._val(x)) for x in body[1]]
            obj.clear()
            obj.update(items)
        elif tag == "g":
            obj.bit_generator.state = self._val(body[2])
        elif tag == "k":
            for cell, value in zip(obj.__closure__ or (), body[4]):
                if value != ["U"]:
                    cell.cell_contents = self._val(value)
            obj.__defaults__ = self._val(body[5])
        elif tag == "o":
            slots = set(_fields(type(obj)))
            if hasattr(obj, "__dict__"):
                vars(obj).clear()
            for key, x in body[2]:
                if not isinstance(key, str) or key.startswith("__"):
                    raise WireError("a field name that is not plain")
                value = self._val(x)
                if key in slots or not hasattr(obj, "__dict__"):
                    object.__setattr__(obj, key, value)
                else:
                    vars(obj)[key] = value

    def _val(self, d):
        if d is None or isinstance(d, (bool, str, int, float)):
            return d
        if not isinstance(d, list) or not d or not isinstance(d[0], str):
            raise WireError("not a value")
        tag = d[0]
        if tag == "r":
            if d[1] not in self.objects:
                raise WireError(f"no object {d[1]}")
            self.touched.add(d[1])
            return self.objects[d[1]]
        if tag == "t":
            return tuple(self._val(x) for x in d[1])
        if tag == "fs":
            return frozenset(self._key(self._val(x)) for x in d[1])
        if tag == "F":
            if d[1] not in ("nan", "inf", "-inf"):
                raise WireError("not a float")
            return float(d[1])
        if tag == "b":
            return base64.b64decode(d[1])
        if tag == "j":
            return complex(self._val(d[1]), self._val(d[2]))
        if tag == "sl":
            return slice(self._val(d[1]), self._val(d[2]), self._val(d[3]))
        if tag == "E":
            return Ellipsis
        if tag == "n":
            return _from_npy(d[1])[()]
        if tag == "dt":
            return np.dtype(d[1])
        if tag == "M":
            if d[1] in PURE_MODULES:
                return PURE_MODULES[d[1]]
            raise WireError(f"no module {d[1]}")
        if tag == "B":
            if d[1] not in PURE_BUILTINS | {"object"}:
                raise WireError(f"no builtin {d[1]}")
            return getattr(builtins, d[1])
        if tag == "P":
            module = PURE_MODULES.get(d[1])
            value = getattr(module, d[2], None) if module is not None and not d[2].startswith("_") else None
            pure = (module is math and callable(value) or isinstance(value, np.ufunc)
                    or isinstance(value, type) and issubclass(value, np.generic))
            if not pure:
                raise WireError(f"no pure function {d[1]}.{d[2]}")
            return value
        if tag == "c":
            return _lookup(d[1])
        if tag == "m":
            owner = self._val(d[1])
            if not _name_of(type(owner)) or not isinstance(d[2], str) or d[2].startswith("__"):
                raise WireError("not a method of a lesson object")
            return getattr(owner, d[2])
        if tag == "h":
            owner, n = d[1], d[2]
            if owner == self.side:
                if n not in self.lent:
                    raise WireError(f"no handle {n}")
                return self.lent[n]
            if n not in self.remotes:
                self.remotes[n] = Remote(self, owner, n)
            return self.remotes[n]
        raise WireError(f"unknown tag {tag!r}")

    @staticmethod
    def _key(k):
        try:
            hash(k)
        except TypeError:
            raise WireError("a dict key or set member that cannot be hashed") from None
        return k


_EMPTY = object()  # a closure cell not yet filled


class Remote:
    """The stand-in for an object that lives on the other side: calling it, reading its items or
    attributes, asking its length, turning it into a list are requests to its owner."""

    __slots__ = ("_codec", "_owner", "_number")

    def __init__(self, codec, owner, number):
        object.__setattr__(self, "_codec", codec)
        object.__setattr__(self, "_owner", owner)
        object.__setattr__(self, "_number", number)

    def _ask(self, op, *args, **kwargs):
        codec = self._codec
        message = {"op": op, "target": ["h", self._owner, self._number], "args": codec.encode(args),
                   "kwargs": codec.encode(kwargs)}
        return codec.channel.request(message)

    def __call__(self, *args, **kwargs):
        return self._ask("call", *args, **kwargs)

    def within(self, owner, method, *args, **kwargs):
        """Call it on its side inside `with owner.method():` (owner a lesson object, sent across)."""
        return self._ask("within", owner, method, *args, **kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name)

    def __setattr__(self, name, value):
        self._ask("setattr", name, value)

    def __getitem__(self, key):
        return self._ask("getitem", key)

    def __setitem__(self, key, value):
        self._ask("setitem", key, value)

    def __len__(self):
        return self._ask("len")

    def __iter__(self):
        return iter(self._ask("list"))

    def __contains__(self, item):
        return self._ask("contains", item)

    def __repr__(self):
        return self._ask("repr")

    def __bool__(self):
        return self._ask("bool")

    def classes(self):
        """(whether it is a class, "module:qualname" of it or its class and their ancestors), as its
        owner says."""
        return self._ask("classes")


_EMPTY = object()
_BY_VALUE = object()   # marks a snapshot compared by value: a set's members, an array's digest


def _snapshot(v):
    """What `v` holds now, cheaply: the objects in a container or in an object's fields (kept, so
    that comparing by identity is safe), a digest of an array's bytes."""
    t = type(v)
    if t is list:
        return tuple(v)
    if t is dict:
        return tuple(x for item in v.items() for x in item)
    if t is set:
        return (_BY_VALUE, frozenset(v))
    if t is np.ndarray:
        return (_BY_VALUE, v.shape, v.dtype.str, hashlib.blake2b(np.ascontiguousarray(v).tobytes()).digest())
    if t is np.random.Generator:
        return (_BY_VALUE, repr(v.bit_generator.state))
    if isinstance(v, types.FunctionType):
        return tuple(c.cell_contents if _cell_full(c) else _EMPTY for c in v.__closure__ or ()) + (v.__defaults__,)
    fields = tuple(getattr(v, f, _EMPTY) for f in _fields(t))
    return fields + (tuple(x for item in vars(v).items() for x in item) if hasattr(v, "__dict__") else ())


def _same(old, new):
    if old is None or type(old) is not type(new) or len(old) != len(new):
        return False
    if new and new[0] is _BY_VALUE:
        return old == new
    return all(a is b for a, b in zip(old, new))


def _reached(codec, start, most=200_000):
    """The numbers of the shared objects that `start` reaches on this side: through containers,
    object fields, bound methods and closures (a learner's module reaches the layers it was given)."""
    seen, todo, found = set(), [start], set()
    while todo and len(seen) < most:
        v = todo.pop()
        if id(v) in seen or v is None or isinstance(v, (bool, int, float, str, bytes, np.ndarray, type,
                                                        types.ModuleType, Remote)):
            n = codec.numbers.get(id(v))
            if n is not None and codec.objects.get(n) is v:
                found.add(n)
            continue
        seen.add(id(v))
        n = codec.numbers.get(id(v))
        if n is not None and codec.objects.get(n) is v:
            found.add(n)
        if isinstance(v, (list, tuple, set, frozenset)):
            todo += list(v)
        elif isinstance(v, dict):
            todo += list(v.keys()) + list(v.values())
        elif isinstance(v, types.MethodType):
            todo.append(v.__self__)
        elif isinstance(v, types.FunctionType):
            todo += [c.cell_contents for c in v.__closure__ or () if _cell_full(c)]
        else:
            todo += [getattr(v, f, None) for f in _fields(type(v))]
            if isinstance(getattr(v, "__dict__", None), dict):
                todo += list(vars(v).values())
    return found


def _cell_full(cell):
    try:
        cell.cell_contents
        return True
    except ValueError:
        return False
