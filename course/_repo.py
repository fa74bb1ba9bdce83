"""Where the course lives on GitHub: the one place that names it.

`make colab REPO=owner/name` (or `python -m course colab owner/name`) rewrites this line,
the README's badges and every notebook's badge and install cell for a fork; the Binder badge and
the JupyterHub links (`python -m course hub-links`) are made from it too.
"""

import re
from urllib.parse import urlencode

REPO = "dl-from-scratch/course"
BRANCH = "main"


def repo_url(repo=None):
    return f"https://github.com/{repo or REPO}"


def git_url(repo=None, ref=None):
    """What pip installs from: the repository, at `ref` (a branch, tag or commit) where given."""
    return f"git+{repo_url(repo)}" + (f"@{ref}" if ref else "")


def colab_url(notebook_path, repo=None, branch=BRANCH):
    return f"https://colab.research.google.com/github/{repo or REPO}/blob/{branch}/{notebook_path}"


def binder_url(path="notebooks", repo=None, branch=BRANCH):
    """mybinder.org's launch link: the repository built by repo2docker (binder/), JupyterLab at `path`."""
    return f"https://mybinder.org/v2/gh/{repo or REPO}/{branch}?" + urlencode({"urlpath": f"lab/tree/{path}"})


def hub_link(hub, notebook_path, repo=None, branch=BRANCH, app="lab"):
    """A JupyterHub link that clones (or updates) the repository in the user's home with nbgitpuller,
    then opens `notebook_path` in it: nbgitpuller clones into a folder named like the repository's
    last path segment, and its `urlpath` must include that folder."""
    if repo and "://" not in repo and not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", repo):
        raise SystemExit(f"--repo takes an https:// address or owner/name on GitHub, not {repo!r}: nbgitpuller "
                         f"clones over https, with no key of the student's")
    url = repo_url(repo) if "://" not in (repo or "") else repo
    folder = url.rstrip("/").split("/")[-1]
    folder = folder[:-4] if folder.endswith(".git") else folder
    opened = f"{'lab/tree' if app == 'lab' else 'tree'}/{folder}/{notebook_path}"
    query = urlencode({"repo": url, "branch": branch, "urlpath": opened})
    return f"{hub.rstrip('/')}/hub/user-redirect/git-pull?{query}"
