"""How a graded notebook becomes points: points per exercise, manual points, and late work.

    points.csv   exercise,points      one row per exercise; 1 point each when there is no file,
                 1.1.1,2              and for an exercise the file does not list
    score        (points of the exercises passed + manual points) x (1 - penalty)
    penalty      late days x the penalty per day (a percentage), at most 100%; a late day is any
                 part of 24 hours after the deadline plus the grace period
"""

import csv
import datetime as dt
import math
import re
from dataclasses import dataclass

DAY = dt.timedelta(days=1)


def read_points(path):
    """{exercise id: points} of an instructor's points file (columns `exercise` and `points`)."""
    from .files import read_csv

    points = {}
    reader = read_csv(path, "points file")
    if not {"exercise", "points"} <= set(reader.fieldnames or ()):
        raise SystemExit(f"{path}: a points file has the columns exercise,points (one row per exercise); "
                         f"its columns are {', '.join(reader.fieldnames or ())}")
    for n, row in enumerate(reader, 2):
        exercise = (row["exercise"] or "").strip()
        if not exercise:
            continue
        try:
            value = float(row["points"])
        except (TypeError, ValueError):
            raise SystemExit(f"{path}, line {n}: the points of {exercise} must be a number, "
                             f"not {row['points']!r}") from None
        if not math.isfinite(value) or value < 0:
            raise SystemExit(f"{path}, line {n}: the points of {exercise} must be 0 or more, not {row['points']}")
        points[exercise] = value
    return points


def write_points(path, exercise_ids):
    """A points file giving each exercise 1 point, for the instructor to edit."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["exercise", "points"])
        writer.writerows([i, 1] for i in exercise_ids)


MOODLE_TIME = "%A, %d %B %Y, %I:%M %p"   # "Friday, 27 November 2026, 5:00 PM", as Moodle shows times


def parse_time(text, where="a time"):
    """An aware datetime from ISO 8601 ("2026-12-01T17:00", "2026-12-01 17:00+01:00", "...Z") or
    Moodle's written form. A time without a zone is in this machine's local zone; a date alone is the
    end of that day (due on 2026-12-01: until 23:59:59 that day)."""
    given = text = str(text).strip()
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            text += "T23:59:59"
        when = dt.datetime.fromisoformat(re.sub(r"Z$", "+00:00", text))
    except ValueError:
        try:
            when = dt.datetime.strptime(text, MOODLE_TIME)
        except ValueError:
            raise SystemExit(f"{where}: {given!r} is not a time; write it as 2026-12-01T17:00 "
                             f"(local time) or 2026-12-01T17:00+01:00") from None
    return when if when.tzinfo is not None else when.astimezone()


@dataclass(frozen=True)
class LatePolicy:
    deadline: dt.datetime | None = None
    per_day: float = 0.0          # percent of the points taken off per late day
    grace: dt.timedelta = dt.timedelta(0)

    def days_late(self, submitted):
        """Whole days (any part counts) after the deadline and its grace; 0 when on time or unknown."""
        if self.deadline is None or submitted is None:
            return 0
        over = submitted - (self.deadline + self.grace)
        return max(0, math.ceil(over / DAY))

    def factor(self, days):
        """What is kept of the points after `days` late days: between 0 and 1."""
        return max(0.0, 1.0 - self.per_day * days / 100.0)


def score(points_passed, manual, factor):
    """Never below zero: manual points can take away what was earned, not more."""
    return round(max(0.0, (points_passed + manual) * factor), 2)
