"""Where the course lives on GitHub: the one place that names it.

`make colab REPO=owner/name` (or `python -m course colab owner/name`) rewrites this line,
the README's badges and every notebook's badge and install cell for a fork.
"""

REPO = "dl-from-scratch/course"
BRANCH = "main"


def git_url(repo=REPO):
    return f"git+https://github.com/{repo}"


def colab_url(notebook_path, repo=REPO, branch=BRANCH):
    return f"https://colab.research.google.com/github/{repo}/blob/{branch}/{notebook_path}"
