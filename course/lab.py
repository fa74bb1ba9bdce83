"""Start JupyterLab on the course: `python -m course lab` (what `make lab` runs).

It opens the top of the course (notebooks/ and solutions/ side by side) and keeps the lab quiet:
on its first start JupyterLab asks "Would you like to get notified about official Jupyter news?"
and checks the internet for a newer version. A learner who came for a lesson needs neither, so:
- the server never fetches news (`--LabApp.news_url=None`) nor checks for updates;
- the question itself is asked by the browser whenever the setting `fetchNews` is "none" (its
  default), whatever the server says, so the course gives that setting the default "false" in
  `overrides.json` of this Python's JupyterLab (the place JupyterLab reads default settings from).
  Any choice the learner makes in Settings > Notifications still wins.

Stop the server with Ctrl-C twice in its terminal (or `jupyter server stop` from another one).
"""

import json
import os
import sys
from pathlib import Path

NEWS_OFF = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}}
LAB_ARGS = ["--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]


def settings_dir():
    """Where this Python's JupyterLab reads `overrides.json` (its application settings folder)."""
    from jupyterlab.commands import get_app_dir

    return Path(get_app_dir()) / "settings"


def quiet_news(folder=None):
    """Add NEWS_OFF to `folder/overrides.json`, keeping every setting already there. Returns the
    file, or None where it cannot be written (then JupyterLab asks once, and that is all)."""
    path = Path(folder if folder is not None else settings_dir()) / "overrides.json"
    try:
        overrides = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except (OSError, ValueError):
        return None  # someone's own file that is not JSON: leave it alone
    if not isinstance(overrides, dict):
        return None
    changed = False
    for plugin, values in NEWS_OFF.items():
        mine = overrides.setdefault(plugin, {})
        for key, value in values.items():
            if key not in mine:
                mine[key] = value
                changed = True
    if changed:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(overrides, indent=2) + "\n", encoding="utf-8")
        except OSError:
            return None
    return path


def command(root):
    """The command line that starts JupyterLab at `root`."""
    cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={root}", *LAB_ARGS]
    if hasattr(os, "getuid") and os.getuid() == 0:  # containers often run as root
        cmd.append("--allow-root")
    return cmd


def main(extra=(), dry_run=False):
    from .notebooks import ROOT

    root = ROOT if (ROOT / "notebooks").is_dir() else Path.cwd()
    cmd = command(root) + list(extra)
    if dry_run:
        print(" ".join(cmd))
        return 0
    quiet_news()
    if os.name == "posix":
        os.execv(cmd[0], cmd)  # JupyterLab takes this process over: Ctrl-C goes straight to it
    import subprocess

    server = subprocess.Popen(cmd)
    while True:
        try:
            return server.wait()
        except KeyboardInterrupt:  # JupyterLab gets Ctrl-C too, and decides when to stop
            continue
