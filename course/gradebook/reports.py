"""The gradebook's files, written from its rows: the course's own CSV, one row per student, the
Canvas and Moodle imports, the copies report, and the feedback pages.

Canvas (Grades > Import): a header `Student, ID, SIS User ID, SIS Login ID, Section`, then one
column per assignment; a column whose title names no existing assignment creates one, and a second
row starting "Points Possible" gives each one's points. ID is the Canvas user id (the roster's
lms_id), SIS User ID the roster's id, SIS Login ID its email; Canvas matches a student by the first
of them it knows.
Moodle (Grades > Import > CSV file): any columns; the teacher maps "ID number" (or "Email address")
to the user's idnumber (or email) under "Identify user by", and each "<lesson> (Real)" column to a
grade item or to a new one. The columns follow Moodle's own plain-text export.
"""

import csv

from .. import grading


def write_all(files, rows, lessons, students, titles, flags_pairs, feedback=True):
    ids = list(dict.fromkeys(i for _, exercise_ids in lessons for i in exercise_ids))
    from . import FIRST_COLUMNS

    _write_csv(files["gradebook"], FIRST_COLUMNS + ids, rows)
    totals = _totals(rows, lessons, students)
    _write_csv(files["students"], ["student", "name", "section"] + [l for l, _ in lessons] + ["total", "max_total"],
               totals)
    # An LMS imports only the students it knows: those not on the roster stay in grades.csv alone.
    enrolled = [line for line in totals if line["_student"].on_roster]
    if len(enrolled) < len(totals):
        strays = [line["student"] for line in totals if not line["_student"].on_roster]
        print(f"left out of the Canvas and Moodle files, not being on the roster: {', '.join(strays)}")
    _canvas(files["canvas"], enrolled, lessons, titles, rows)
    _moodle(files["moodle"], enrolled, lessons, titles)
    _write_csv(files["copies"], ["lesson", "student", "like", "similarity"],
               [dict(zip(["lesson", "student", "like", "similarity"], pair)) for pair in flags_pairs])
    if feedback:
        _feedback(files["feedback"], rows, totals, lessons, titles)
    written = [files[k] for k in ("gradebook", "students", "canvas", "moodle", "copies")]
    print("wrote " + ", ".join(str(f) for f in written) + (f" and {files['feedback']}/" if feedback else ""))


def _write_csv(path, columns, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="", extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def _totals(rows, lessons, students):
    """One row per student: each lesson's score, the total, and the most it could be."""
    best = {}
    for row in rows:
        if row["lesson"]:
            best[(row["student"], row["lesson"])] = row
    totals = []
    for student in sorted(students.values(), key=lambda s: s.id):
        line = {"student": student.id, "name": student.name, "section": student.section, "_student": student}
        total = most = 0.0
        for lesson, _ in lessons:
            row = best.get((student.id, lesson))
            if row is not None:
                line[lesson] = row["score"]
                total += float(row["score"])
                most += float(row["max_points"])
        line["total"], line["max_total"] = f"{round(total, 2):g}", f"{most:g}"
        totals.append(line)
    return totals


def _canvas(path, totals, lessons, titles, rows):
    most = {row["lesson"]: row["max_points"] for row in rows if row["lesson"]}
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["Student", "ID", "SIS User ID", "SIS Login ID", "Section"] + [titles[l] for l, _ in lessons])
        writer.writerow(["    Points Possible", "", "", "", ""] + [most.get(l, "") for l, _ in lessons])
        for line in totals:
            s = line["_student"]
            writer.writerow([s.name or s.id, s.lms_id, s.id, s.email, s.section] + [line.get(l, "") for l, _ in lessons])


def _moodle(path, totals, lessons, titles):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["First name", "Last name", "ID number", "Email address"]
                        + [f"{titles[l]} (Real)" for l, _ in lessons])
        for line in totals:
            s = line["_student"]
            name = s.name or s.id
            if ", " in name:  # Canvas's sortable form: "Dam, Jane van"
                last, _, first = name.partition(", ")
            else:
                first, _, last = name.rpartition(" ")  # "Jane van Dam" -> "Jane van", "Dam"
            writer.writerow([first, last, s.id, s.email] + [line.get(l, "") for l, _ in lessons])


def _page_names(keys):
    taken = set()
    return {key: grading.page_name(key, taken) for key in keys}


def _feedback(folder, rows, totals, lessons, titles):
    """A page per submission, and one per student gathering their lessons with score and penalty.
    Copy flags are for the instructor's review, not in what goes back to the student."""
    import html

    folder.mkdir(parents=True, exist_ok=True)
    graded = [r for r in rows if r["lesson"]]
    names = _page_names([(r["student"], r["lesson"]) for r in graded] + [(t["student"],) for t in totals])
    by_student = {}
    for row in graded:
        by_student.setdefault(row["student"], []).append(row)
        if row["_record"] is not None:
            grading.write_feedback_page(folder / names[(row["student"], row["lesson"])], row["_record"])
    for line in totals:
        student = line["_student"]
        body = [f"<h1>{html.escape(student.name or student.id)}</h1>",
                f"<p>Total: {line['total']} of {line['max_total']} points.</p>"]
        for row in by_student.get(student.id, []):
            body.append(f"<h2>{html.escape(titles.get(row['lesson'], row['lesson']))}</h2>")
            body.append(f"<p>Score: {row['score']} of {row['max_points']} points"
                        + (f" ({row['points']} for the exercises passed" + (f", {row['manual']} by hand" if row["manual"]
                           else "") + ")" if row["_record"] is not None else "")
                        + (f"; {row['days_late']} day{'s' if row['days_late'] != 1 else ''} late, "
                           f"{row['penalty']} off" if row["days_late"] else "") + ".</p>")
            if row["comment"]:
                body.append(f"<p>From your instructor: {html.escape(row['comment'])}</p>")
            if row["_record"] is None:
                body.append("<p>No submission.</p>")
            else:
                body += grading.feedback_html(row["_record"], heading="Exercises")[1:]
        (folder / names[(student.id,)]).write_text(grading.html_page(f"Feedback for {student.name or student.id}",
                                                                     body), encoding="utf-8")
