"""A made-up class for the gradebook's tests: lesson 1.1 answered in many honest ways, partly,
not at all, twice (a twin under another name), by pasting the course's solutions, and broken.

The handout is lesson 1.1 as `make assignment` writes it (pinned install cell, version stamp), cut
down to the install cell, the imports the exercises use and the exercise cells: the lesson's plots
would take a kernel longer than the rest of its grading, and they are not what is being tested."""

import re

import nbformat

# Each exercise's answers, written differently (the function bodies, indented by four spaces).
DERIVATIVE = [
    "left = f(x - h)\n    right = f(x + h)\n    return (right - left) / (h + h)",
    "slope = f(x + h) - f(x - h)\n    slope /= 2 * h\n    return slope",
    "return 0.5 * (f(x + h) - f(x - h)) / h",
    "above, below = f(x + h), f(x - h)\n    return (above - below) / h / 2",
]
GRADIENT = [
    "def shifted(i, d):\n        ys = list(xs)\n        ys[i] += d\n        return ys\n"
    "    return [(f(shifted(i, h)) - f(shifted(i, -h))) / (2 * h) for i in range(len(xs))]",
    "xs = np.array(xs, dtype=float)\n    g = np.zeros_like(xs)\n    for i in range(xs.size):\n"
    "        e = np.zeros_like(xs)\n        e[i] = h\n        g[i] = (f(list(xs + e)) - f(list(xs - e))) / (2 * h)\n"
    "    return g.tolist()",
    "out = []\n    i = 0\n    while i < len(xs):\n        a = list(xs[:i]) + [xs[i] + h] + list(xs[i + 1:])\n"
    "        b = list(xs[:i]) + [xs[i] - h] + list(xs[i + 1:])\n        out.append((f(a) - f(b)) / (2 * h))\n"
    "        i += 1\n    return out",
    "return [numerical_derivative(lambda t, i=i: f(list(xs[:i]) + [t] + list(xs[i + 1:])), xs[i], h)\n"
    "            for i in range(len(xs))]",
    "import copy\n    result = []\n    for i, v in enumerate(xs):\n        hi, lo = copy.copy(list(xs)), copy.copy(list(xs))\n"
    "        hi[i], lo[i] = v + h, v - h\n        result.append((f(hi) - f(lo)) / (2 * h))\n    return result",
    "def partial(i):\n        p, m = list(xs), list(xs)\n        p[i] += h\n        m[i] -= h\n"
    "        return (f(p) - f(m)) / 2 / h\n    return list(map(partial, range(len(xs))))",
    "n = len(xs)\n    grads = [0.0] * n\n    xs = list(xs)\n    for k in range(n):\n        saved = xs[k]\n"
    "        xs[k] = saved + h\n        fp = f(xs)\n        xs[k] = saved - h\n        fm = f(xs)\n        xs[k] = saved\n"
    "        grads[k] = (fp - fm) / (2 * h)\n    return grads",
    "g = []\n    for i in range(len(xs)):\n        step = [h if j == i else 0.0 for j in range(len(xs))]\n"
    "        up = [a + b for a, b in zip(xs, step)]\n        down = [a - b for a, b in zip(xs, step)]\n"
    "        g.append((f(up) - f(down)) / (2 * h))\n    return g",
    "grad = [None] * len(xs)\n    for i in reversed(range(len(xs))):\n        bumped = list(xs)\n        bumped[i] = xs[i] + h\n"
    "        dropped = list(xs)\n        dropped[i] = xs[i] - h\n        grad[i] = (f(bumped) - f(dropped)) * (0.5 / h)\n"
    "    return grad",
]
COMPOSITION = [
    "def d(x):\n        return df(g(x)) * dg(x)\n    return d",
    "def chain(x):\n        inner = g(x)\n        return dg(x) * df(inner)\n    return chain",
    "return lambda t: dg(t) * df(g(t))",
]
BY_HAND = [
    "u = 2 * x - 1\n    t = math.tanh(u)\n    return 4 * t * (1 - t * t)",
    "t = math.tanh(2 * x - 1)\n    dt = 1 - t ** 2\n    return 2 * t * dt * 2",
    "return 4 * math.tanh(2 * x - 1) / math.cosh(2 * x - 1) ** 2",
]
BODIES = {"1.1.1": DERIVATIVE, "1.1.2": GRADIENT, "1.1.3": COMPOSITION, "1.1.4": BY_HAND}


def exercises_only(nb):
    """The handed-out lesson with only its install cell, the imports the exercises need, and the exercises."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    nb = nbformat.from_dict(nbformat.reads(nbformat.writes(nb), as_version=4))
    nb.cells = [code[0], nbformat.v4.new_code_cell("import math\n\nimport numpy as np\n\nfrom course.exercises import check")]
    nb.cells += [c for c in code if 'check("' in c.source]
    return nb


def pasted(handout, solution):
    """The handout with each exercise cell replaced by the course's worked solution of it."""
    nb = nbformat.from_dict(nbformat.reads(nbformat.writes(handout), as_version=4))
    worked = {c.source.split("check(")[-1][:9]: c.source for c in solution.cells
              if c.cell_type == "code" and 'check("' in c.source}
    for cell in nb.cells:
        if cell.cell_type == "code" and 'check("' in cell.source:
            cell.source = worked[cell.source.split("check(")[-1][:9]]
    return nb


def answered(handout, answers):
    """The handed-out notebook with the exercise cells of `answers` ({id: function body}) filled in."""
    nb = nbformat.from_dict(nbformat.reads(nbformat.writes(handout), as_version=4))
    for cell in nb.cells:
        for exercise_id, body in answers.items():
            if cell.cell_type == "code" and f'check("{exercise_id}"' in cell.source:
                head = cell.source.split("\n")[0]   # def name(args):
                cell.source = f"{head}\n    {body}\n\n\ncheck(\"{exercise_id}\", {head[4:head.index('(')]})\n"
    return nb


def honest(handout, n):
    """The n-th honest learner's notebook: each has a way of writing numerical_gradient of its own."""
    pick = {"1.1.1": n % 4, "1.1.2": n, "1.1.3": n % 3, "1.1.4": (n // 3) % 3}
    return answered(handout, {i: BODIES[i][k] for i, k in pick.items()})


def partly(handout, n):
    """Some exercises only (the small ones, each of them written in one of the ways above)."""
    ids = [["1.1.1"], ["1.1.3"], ["1.1.1", "1.1.4"], ["1.1.3", "1.1.4"]][n % 4]
    return answered(handout, {i: BODIES[i][n % len(BODIES[i])] for i in ids})


def renamed(nb):
    """The same answers with other variable names, spacing and comments: a copy made to look new."""
    nb = nbformat.from_dict(nbformat.reads(nbformat.writes(nb), as_version=4))
    swaps = {"xs": "points", "grads": "gs", "up": "plus", "down": "minus", "v": "val", "t": "tt"}
    for cell in nb.cells:
        if cell.cell_type == "code" and "check(" in cell.source:
            source = re.sub(r"\b(\w+)\b", lambda m: swaps.get(m[1], m[1]), cell.source)
            cell.source = "# my own work\n" + source.replace(" = ", "  =  ").replace("return", "return ")
    return nb

