"""The learner's side of grading: a process that holds the learner's functions and only answers.

It runs inside the sandbox, started by the grader with `python -I -c "...answerer.main()"`:

1. Its job comes on stdin: the course's source as the grader read it before any submission ran
   (written into a folder of its own by the start-up code, `remote.BOOT`), the modules to load,
   and for each exercise the learner's code (the notebook's imports, definitions and constants,
   and the exercise's own cell), the library names the exercise asks the learner to write, and
   the pipe its check will talk on.
2. It imports what the lesson needs and deletes the source: from here on nothing in the sandbox
   can read the package's code or import a fresh copy of it.
3. For each exercise it forks a child. The child removes from memory the names the exercise
   rebuilds (and makes sure nothing else still holds them), then runs the learner's code, then
   answers the check's calls of the learner's function on its pipe: the check itself, the
   expected values and the verdict are in another process, which this one cannot see.

A child that runs longer than the exercise's time is stopped with everything it started; the next
exercise gets a fresh child, and only its own pipe.
"""

import builtins
import gc
import os
import shutil
import signal
import sys
import time
import types
import weakref

from . import wire

PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 4, 36  # prctl(2) options


def _prctl(option, value):
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _delete_sources(root):
    """Remove every Python file and bytecode cache under `root`, keeping data folders."""
    for folder, dirs, files in os.walk(root, topdown=False):
        for name in files:
            if name.endswith((".py", ".pyc")):
                try:
                    os.remove(os.path.join(folder, name))
                except OSError:  # a read-only data folder bound into the sandbox
                    pass
        if os.path.basename(folder) == "__pycache__":
            shutil.rmtree(folder, ignore_errors=True)
    sys.path_importer_cache.clear()


def _owners(obj):
    """Every place in the loaded course modules (module globals, class bodies, tables held in them)
    that holds `obj`, as (container, key)."""
    found = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "course" or name.startswith("course.")):
            continue
        space = vars(module)
        for key, value in list(space.items()):
            if value is obj:
                found.append((space, key))
            elif isinstance(value, dict):
                found += [(value, k) for k, v in list(value.items()) if v is obj]
                # an operation's definition in a registry that names its shape rule, say
                found += [(item, k) for item in list(value.values()) if hasattr(item, "__dict__")
                          and not isinstance(item, (type, types.ModuleType, types.FunctionType))
                          for k, v in list(vars(item).items()) if v is obj]
            elif isinstance(value, type) and value.__module__ == name:
                found += [(value, k) for k, v in list(vars(value).items())
                          if v is obj or getattr(v, "__func__", None) is obj]
    return found


def _resolve(path):
    """(object, owner class or None, name) of a dotted path among the loaded modules."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is None:
            continue
        owner, obj = None, module
        for name in parts[cut:]:
            owner, obj = obj, getattr(obj, name, None)
            if obj is None:
                return None, None, name
        return obj, owner if isinstance(owner, type) else None, parts[-1]
    return None, None, parts[-1]


def _absent(path):
    def absent(*args, **kwargs):
        raise NameError(f"{path} is not available while this exercise is graded: the exercise asks you "
                        f"to write it")
    return absent


def strip(paths):
    """Remove the library names an exercise asks the learner to write, from every module and class
    that holds them, and check that nothing keeps the objects alive. Returns the problems."""
    watch, problems = [], []
    for path in paths:
        obj, owner, name = _resolve(path)
        if obj is None:
            continue  # not loaded at all: absent already
        if owner is not None and name in vars(owner):
            delattr(owner, name)
        for container, key in _owners(obj):
            if isinstance(container, dict):
                container.pop(key, None)
            elif isinstance(container, type):
                try:
                    delattr(container, key)
                except (AttributeError, TypeError):
                    pass
            else:  # an object of the library that uses it: it now says why it cannot
                setattr(container, key, _absent(path))
        func = getattr(obj, "__func__", obj)
        try:
            watch.append((path, weakref.ref(func)))
        except TypeError:
            pass
        del obj, func
    gc.collect()
    for path, ref in watch:
        if ref() is not None:
            kinds = sorted({type(r).__name__ for r in gc.get_referrers(ref())} - {"list", "frame"})
            problems.append(f"{path} is still held by {', '.join(kinds) or 'something'}")
    return problems


def _fake_exercises():
    """`from course.exercises import check` works while answering, and does nothing: the checks
    are not in this process."""
    import course

    module = types.ModuleType("course.exercises")
    module.check = lambda *args, **kwargs: None
    sys.modules["course.exercises"] = module
    course.exercises = module


def _run_code(statements, quiet=()):
    """Run the learner's statements one by one in a fresh namespace; a statement that fails is
    noted (unless it is one of the lesson's own, `quiet`) and the rest still run."""
    space = {"__name__": "__main__", "__builtins__": builtins}
    notes = []
    quiet = set(quiet)
    for k, source in enumerate(statements):
        try:
            exec(compile(source, f"<notebook {k}>", "exec"), space)
        except BaseException as err:  # noqa: BLE001 - the learner's code: note it and go on
            if isinstance(err, KeyboardInterrupt):
                raise
            if k in quiet:
                continue
            first = source.strip().splitlines()[0][:80] if source.strip() else ""
            notes.append(f"`{first}` could not run here: {type(err).__name__}: {str(err)[:200]}")
    return space, notes


def _answer(exercise):
    """In the child: make the exercise's world, run the learner's code, answer the check."""
    read_fd, write_fd = exercise["fds"]
    problems = strip(exercise["strip"])
    if problems:
        wire.send(write_fd, {"op": "unsafe", "why": "; ".join(problems)})
        return
    _fake_exercises()
    space, notes = _run_code(exercise["code"], exercise.get("quiet", ()))
    name = exercise["name"]
    if name not in space:
        wire.send(write_fd, {"op": "missing", "notes": notes})
        return
    channel = wire.Channel("b", read_fd, write_fd)
    if exercise.get("kernel"):  # described, not called: the grader rebuilds it from the notebook's source
        wire.send(write_fd, {"op": "kernel", "notes": notes, **describe_kernel(space[name], channel.codec)})
        wire.receive(read_fd)
        return
    wire.send(write_fd, {"op": "ready", "candidate": channel.codec.encode(space[name]), "notes": notes})
    while True:
        message = wire.receive(read_fd)
        if message.get("op") == "done":
            return
        channel.serve_one(message)


def _statement(fn):
    """The index of the notebook statement that defined a function (compiled as "<notebook k>")."""
    name = fn.__code__.co_filename
    if name.startswith("<notebook ") and name.endswith(">"):
        return int(name[len("<notebook "):-1])
    return None


def describe_kernel(candidate, codec):
    """What the grader needs to rebuild a kernel from the notebook's own source: the kernel's name
    and statement, and for each global name it (or a device function it calls) looks up: a module's
    name, a function of the notebook's (its statement, whether it is a device function), or a plain
    value. The grader trusts none of it beyond what its own copy of the source says."""
    from course.kernels import compile as gpu

    fn = getattr(candidate, "py_func", candidate)
    if not isinstance(fn, types.FunctionType) or _statement(fn) is None:
        return {"kernel": None, "why": f"expected a kernel written in the notebook, got {type(candidate).__name__}"}
    found, todo, names = {}, [fn], {}
    while todo:
        f = todo.pop()
        if f.__name__ in found:
            continue
        jitted = gpu._jitted(f)
        device = bool(jitted[1]) if jitted else False
        f = jitted[0] if jitted else f
        found[f.__name__] = [_statement(f), device]
        for name in sorted(gpu._names(f.__code__)):
            if name not in f.__globals__ or name in names:
                continue
            value = f.__globals__[name]
            inner = getattr(value, "py_func", value)
            if isinstance(value, types.ModuleType):
                names[name] = ["module", value.__name__]
            elif type(value).__module__.startswith("numba.core.types"):  # numba.float32, say
                names[name] = ["numba", str(value)]
            elif isinstance(inner, types.FunctionType) and _statement(inner) is not None:
                names[name] = ["function", inner.__name__]
                todo.append(value)
            else:
                try:
                    names[name] = ["value", codec.encode(value)]
                except wire.WireError:
                    names[name] = ["unknown", type(value).__name__]
    device = getattr(candidate, "py_func", None) is not None and bool((gpu._jitted(candidate) or (0, 0))[1])
    return {"kernel": fn.__name__, "functions": found, "globals": names, "device": device}


def _stop_tree(pid):
    """Kill a child and everything it started (this process adopted its orphans)."""
    try:
        import psutil

        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
        for p in procs:
            try:
                p.suspend()
            except psutil.Error:
                pass
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        for p in psutil.Process().children(recursive=True):  # orphans adopted meanwhile
            try:
                p.kill()
            except psutil.Error:
                pass
    except Exception:  # noqa: BLE001 - without psutil, the child at least
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _reap_all():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(job, root):
    """Run by the grader's start-up code, which has written the course's source into `root` and
    put it first on the path."""
    # No process of the learner's may read this one's memory, and every process a child leaves
    # behind becomes this one's, to be stopped with it.
    _prctl(PR_SET_DUMPABLE, 0)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    for name in job["preload"]:
        try:
            __import__(name)
        except BaseException:  # noqa: BLE001 - a module the notebook names but cannot import here
            pass
    _delete_sources(root)
    sys.path[:] = [p for p in sys.path if p != root]
    exercises = job["exercises"]
    for k, exercise in enumerate(exercises):
        pid = os.fork()
        if pid == 0:
            try:
                for later in exercises[k + 1:]:  # the earlier ones this process closed already
                    for fd in later["fds"]:
                        os.close(fd)
                _answer(exercise)
            except BaseException as err:  # noqa: BLE001 - the check is told, and sees the channel close
                try:
                    wire.send(exercise["fds"][1], {"op": "broken", "why": f"{type(err).__name__}: {err}"[:300]})
                except Exception:  # noqa: BLE001 - the channel is gone too
                    pass
            finally:
                os._exit(0)
        for fd in exercise["fds"]:
            os.close(fd)
        deadline = time.monotonic() + exercise["seconds"]
        while True:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                _stop_tree(pid)
                os.waitpid(pid, 0)
                break
            time.sleep(0.01)
        _stop_tree_orphans()


def _stop_tree_orphans():
    """Whatever a finished child left running is stopped before the next exercise starts."""
    try:
        import psutil

        for p in psutil.Process().children(recursive=True):
            try:
                p.kill()
            except psutil.Error:
                pass
    except ImportError:
        pass
    _reap_all()
