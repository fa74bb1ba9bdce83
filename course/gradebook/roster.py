"""Who handed in what: the students of a class, and which student each submission belongs to.

Without a roster, a submission belongs to the folder it is in: `submissions/<student>/<lesson>.ipynb`.
With one (`--roster roster.csv`), each row is a student; a submission is matched to a row by that
folder name, or by the student's number in an LMS's download names:
- Canvas ("Download submissions"): `smithjane_12345_67890_1.1-derivatives.ipynb` (`_late_` may follow the
  name), where 12345 is the student's Canvas user id;
- Moodle ("Download all submissions"): a folder `Jane Smith_12345_assignsubmission_file_` per student, or
  the same words before the file name, where 12345 is the participant id.

A roster's columns, in any order, any case (the first of each list found is used):
    id       sis user id, id number, student id, username, id (what names the student's folder)
    name     name, full name, student name, student; or first name and last name
    section  section, group
    email    email, email address, sis login id
    lms_id   lms_id, lms id, canvas user id, participant id, participant; and Canvas's own "ID"
             beside its "SIS User ID" (a Canvas gradebook export: Student, ID, SIS User ID, ...)
    submitted   submitted, submitted at, submission time, last modified (submission)
`submitted`, where given, is the time the LMS recorded for the student's submission (an export of one
assignment); otherwise the file's own modification time is used. Moodle's participant id, which its
download names carry, is on its Participants page (the id= in each person's link).
"""

import re
from dataclasses import dataclass
from pathlib import Path

COLUMNS = {
    "id": ("sis user id", "id number", "student id", "username", "id"),
    "name": ("name", "full name", "student name", "student"),
    "section": ("section", "group"),
    "email": ("email", "email address", "sis login id"),
    "lms_id": ("lms_id", "lms id", "canvas user id", "participant id", "participant"),
    "submitted": ("submitted", "submitted at", "submission time", "last modified (submission)"),
}
IGNORED = ("integration id", "root account", "institution", "department", "phone", "city/town", "country",
           "last downloaded from this course", "first name", "last name")

CANVAS_NAME = re.compile(r"^[a-z]+_(?:late_)?(?P<number>\d+)_\d+_(?P<file>.+)$")
MOODLE_NAME = re.compile(r"^(?P<name>.+?)_(?P<number>\d+)_assignsubmission_[a-z]+_(?P<file>.*)$")


@dataclass(frozen=True)
class Student:
    id: str
    name: str = ""
    section: str = ""
    email: str = ""
    lms_id: str = ""
    submitted: str = ""   # the LMS's submission time, where the roster gives one
    on_roster: bool = True


def read_roster(path):
    """[Student] of a roster CSV; a clear error for a roster without an id column or with an id twice."""
    from .files import read_csv

    reader = read_csv(path, "roster")
    header = {name.strip().lower(): name for name in reader.fieldnames or ()}
    found = {key: next((header[c] for c in choices if c in header), None) for key, choices in COLUMNS.items()}
    if "sis user id" in header and "id" in header and found["lms_id"] is None:
        found["lms_id"] = header["id"]  # Canvas's export: ID is the Canvas user id
    if found["id"] is None:
        raise SystemExit(f"{path}: a roster needs a column of student ids (one of: "
                         f"{', '.join(COLUMNS['id'])}); its columns are {', '.join(reader.fieldnames or ())}")
    first, last = header.get("first name"), header.get("last name")
    used = set(found.values()) | {first, last}
    unused = [name for low, name in header.items() if name not in used and low not in IGNORED]
    if unused:
        print(f"{path}: not using the column{'s' if len(unused) > 1 else ''} {', '.join(unused)} "
              f"(the roster's columns are: {', '.join(COLUMNS)})")
    students, seen = [], set()
    for n, row in enumerate(reader, 2):
        values = {key: (row.get(column) or "").strip() if column else "" for key, column in found.items()}
        if not values["name"] and (first or last):  # Moodle's export: First name, Last name
            values["name"] = " ".join(filter(None, [(row.get(first) or "").strip() if first else "",
                                                    (row.get(last) or "").strip() if last else ""]))
        if not values["id"] or values["name"].strip().lower() == "points possible":
            continue  # a blank line, or a Canvas export's "Points Possible" row
        if values["id"] in seen:
            raise SystemExit(f"{path}, line {n}: the student id {values['id']!r} is on the roster twice")
        seen.add(values["id"])
        students.append(Student(**values))
    return students


def submitter(path):
    """(the key that names the student, the file name as handed out) of a submission's path."""
    path = Path(path)
    canvas = CANVAS_NAME.match(path.name)
    if canvas:
        return canvas["number"], canvas["file"]
    for part in (path.name, path.parent.name):
        moodle = MOODLE_NAME.match(part)
        if moodle:
            return moodle["number"], moodle["file"] if part == path.name else path.name
    return path.parent.name, path.name


class Roster:
    """Finds the student of each submission; students not on a roster are made up from the key."""

    def __init__(self, students=()):
        self.students = list(students)
        self._by_key = {}
        for student in self.students:
            for key in (student.id, student.lms_id, student.email):
                if key:
                    self._by_key.setdefault(key.lower(), student)

    def __bool__(self):
        return bool(self.students)

    def student_of(self, path):
        key, _ = submitter(path)
        found = self._by_key.get(key.lower())
        if found is not None:
            return found
        return Student(id=key, on_roster=not self.students)
