"""For instructors: what grading runs on each side of the sandbox's wall (see course.grading)."""
