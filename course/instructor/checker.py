"""The trusted side of grading: a check run on a learner's function that lives in another process.

This runs in the grader itself, outside the sandbox: a process the learner's code can neither see
nor signal nor read (the sandbox has its own PID namespace, and the grader is not dumpable). The
checks are those the grader loaded before any submission ran. Each check draws its inputs afresh
and calls the learner's function through a `wire.Remote`: the arguments go over the exercise's
pipe as plain data, the learner's results come back as plain data, and the expected values and the
verdict are computed here.
"""

import os

from . import wire


def check_one(exercise, seed, run_kernel=None):
    """(outcome, message) of one exercise, talking to its answering process on its pipe. A kernel
    is not called across: `run_kernel(exercise, description)` checks it in a process of its own."""
    from course.exercises import _core

    read_fd, write_fd = exercise["fds"]
    exercise_id = exercise["id"]
    channel = wire.Channel("a", read_fd, write_fd)
    try:
        first = wire.receive(read_fd)
        kind = first.get("op")
        notes = [str(n) for n in first.get("notes", [])][:3]
        if kind == "missing":
            if notes:  # its definition failed: most often it reaches for what the exercise rebuilds
                return "failed", (f"[{exercise_id}] failed: {exercise['name']} could not be defined while "
                                  f"grading: " + "; ".join(notes))
            return "not attempted", f"[{exercise_id}] not attempted: the notebook defines no {exercise['name']}"
        if kind == "broken":
            return "failed", f"[{exercise_id}] failed: the notebook's code could not be prepared ({first.get('why')})"
        if kind == "unsafe":
            return "not run", f"[{exercise_id}] could not be graded safely: {first.get('why')}"
        if kind == "kernel" and run_kernel is not None:
            outcome, message = run_kernel(exercise, first)
            if outcome != "passed" and notes:
                message += " (while grading: " + "; ".join(notes) + ")"
            return outcome, message
        if kind != "ready":
            return "failed", f"[{exercise_id}] failed: the notebook's process did not answer"
        candidate = channel.codec.decode(first["candidate"])
        result = _core.run(exercise_id, candidate, gate=False, fresh=seed)
        message = result.message
        if result.status != "passed" and notes:
            message += " (while grading: " + "; ".join(notes) + ")"
        return result.status, message
    except wire.Gone:
        return "failed", (f"[{exercise_id}] failed: your code stopped answering (it ran longer than "
                          f"{exercise['seconds']:g} s, or ended its process)")
    except wire.WireError as err:
        return "failed", f"[{exercise_id}] failed: your function returned what cannot be checked ({err})"
    finally:
        try:
            wire.send(write_fd, {"op": "done"})
        except OSError:
            pass
        for fd in (read_fd, write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
