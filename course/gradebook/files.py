"""Reading the instructor's CSV files, however their spreadsheet saved them."""

import csv
import io


def read_csv(path, what):
    """A csv.DictReader over the file at `path` (`what` names it in errors): UTF-8, with or without
    the byte-order mark spreadsheets write, or else Windows' Latin-1 (what Excel saves as "CSV")."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except IsADirectoryError:
        raise SystemExit(f"the {what} {path} is a folder: give the CSV file") from None
    except OSError as err:
        raise SystemExit(f"cannot read the {what} {path}: {err.strerror or err}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = data.decode("cp1252", errors="replace")
        print(f"{path}: not UTF-8, read as Windows Latin-1 (cp1252); save it as UTF-8 CSV to be sure of its names")
    return csv.DictReader(io.StringIO(text, newline=""))
