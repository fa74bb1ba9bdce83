"""The trusted side of grading: the checks run here, on the learner's functions in another process.

Started by the grader with `python -I -c "...checker.main()"`, outside the learner's sandbox, as
a process the learner's code cannot see, signal or read (it is in another PID namespace, and this
process is not dumpable). It loads the checks from the course's source as the grader read it
before any submission ran, draws each check's inputs afresh, and calls the learner's function
through a `wire.Remote`: the call's arguments go over the exercise's pipe as plain data, the
learner's results come back as plain data, and the expected values and the verdict are computed
here. It reports the outcomes to the grader on its stdout, which nothing else writes to.
"""

import json
import os
import shutil

from . import wire

PR_SET_DUMPABLE = 4


def check_one(core, exercise, limit_note):
    """(outcome, message) of one exercise, talking to its answering child on its pipe."""
    read_fd, write_fd = exercise["fds"]
    channel = wire.Channel("a", read_fd, write_fd)
    try:
        first = wire.receive(read_fd)
        kind = first.get("op")
        if kind == "missing":
            notes = [str(n) for n in first.get("notes", [])][:3]
            if notes:  # its definition failed: most often it reaches for what the exercise rebuilds
                return "failed", (f"[{exercise['id']}] failed: {exercise['name']} could not be defined while "
                                  f"grading: " + "; ".join(notes))
            return "not attempted", f"[{exercise['id']}] not attempted: the notebook defines no {exercise['name']}"
        if kind == "broken":
            return "failed", f"[{exercise['id']}] failed: the notebook's code could not be prepared ({first.get('why')})"
        if kind == "unsafe":
            return "not run", f"[{exercise['id']}] could not be graded safely: {first.get('why')}"
        if kind != "ready":
            return "failed", f"[{exercise['id']}] failed: the notebook's process did not answer"
        candidate = channel.codec.decode(first["candidate"])
        result = core.run(exercise["id"], candidate, gate=False)
        notes = [str(n) for n in first.get("notes", [])][:3]
        message = result.message
        if result.status != "passed" and notes:
            message += " (while grading: " + "; ".join(notes) + ")"
        return result.status, message
    except wire.Gone:
        return "failed", f"[{exercise['id']}] failed: your code stopped answering ({limit_note})"
    except wire.WireError as err:
        return "failed", f"[{exercise['id']}] failed: your function returned what cannot be checked ({err})"
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


def main(job, root):
    """Run by the grader's start-up code, which has written the course's source (as the grader
    read it before any submission ran) into `root` and put it first on the path."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    import course.exercises._core as core

    core._FRESH = job["seed"]  # inputs no earlier run has seen
    report = {}
    try:
        for exercise in job["exercises"]:
            note = f"it ran longer than {exercise['seconds']:g} s, or ended its process"
            report[exercise["id"]] = check_one(core, exercise, note)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    os.write(1, (json.dumps(report) + "\n").encode())
