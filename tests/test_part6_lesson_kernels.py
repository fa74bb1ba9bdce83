"""The kernels written in the part-6 lessons keep to what a GPU compile accepts, checked on the
source: the test suite runs the lessons on the simulator, which accepts a shared or local array
whose shape is only known when the kernel runs, while numba's GPU compiler refuses it. (The
library's kernels and the solutions' are compiled to PTX in test_part6_compile.py; compiling the
lessons' would mean running every lesson a second time.)"""

import ast
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.part6
ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks" / "6-kernels").glob("*.ipynb")) + \
    sorted((ROOT / "solutions" / "6-kernels").glob("*.ipynb"))


def _is_cuda_jit(decorator):
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return ast.unparse(target) == "cuda.jit"


def _assigned_in(fn):
    """The names a kernel binds itself: its parameters and its local variables (run-time values)."""
    names = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _not_constant(shape, local_names):
    """Why an array shape is not a compile-time constant, or None where it is: a number, a name set
    outside the kernel (a global or a factory's variable), or a tuple of those."""
    parts = shape.elts if isinstance(shape, ast.Tuple) else [shape]
    for part in parts:
        if isinstance(part, ast.Constant) and isinstance(part.value, int):
            continue
        if isinstance(part, ast.Name) and part.id not in local_names:
            continue
        if isinstance(part, ast.Attribute) and not ast.unparse(part).startswith("cuda."):
            continue  # a module's constant, such as K.TILE
        if isinstance(part, ast.Name):
            return f"`{part.id}` is set inside the kernel, when it runs"
        return f"`{ast.unparse(part)}` is computed when the kernel runs"
    return None


def array_shape_problems(source):
    """[(kernel name, the array call, why)] for every cuda.shared.array / cuda.local.array call in
    a @cuda.jit function of `source` whose shape a GPU compile would refuse."""
    problems = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef) or not any(_is_cuda_jit(d) for d in fn.decorator_list):
            continue
        local_names = _assigned_in(fn)
        for call in ast.walk(fn):
            if not (isinstance(call, ast.Call) and ast.unparse(call.func) in ("cuda.shared.array", "cuda.local.array")):
                continue
            shape = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "shape"), None)
            why = shape is not None and _not_constant(shape, local_names)
            if why:
                problems.append((fn.name, ast.unparse(call), why))
    return problems


def _code_cells(path):
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    return [(number, "".join(cell["source"])) for number, cell in enumerate(cells, 1)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[f"{p.parent.parent.name}/{p.name}" for p in NOTEBOOKS])
def test_every_shared_and_local_array_has_a_constant_shape(path):
    found = [f"code cell {n}: {kernel}: {call}: {why}"
             for n, source in _code_cells(path) for kernel, call, why in array_shape_problems(source)]
    assert not found, f"{path.name}: a GPU would not compile these (the simulator does):\n" + "\n".join(found)


def test_the_shapes_a_gpu_refuses_are_found():
    kernels = '''
@cuda.jit
def good(x):
    a = cuda.shared.array((TILE, K.TILE), float32)

@cuda.jit
def by_block(x):
    cache = cuda.shared.array(cuda.blockDim.x, float32)

@cuda.jit
def by_size(x):
    n = x.size
    h = cuda.local.array(n, float32)

def factory(bm, pad):
    @cuda.jit
    def sum_in_shape(a):
        tile = cuda.shared.array((8, bm + pad), float32)
    return sum_in_shape

def factory_fixed(bm, pad):
    width = bm + pad
    @cuda.jit(fastmath=True)
    def fine(a):
        tile = cuda.shared.array((8, width), float32)
        acc = cuda.local.array(shape=(4, 4), dtype=float32)
    return fine
'''
    found = {kernel: why for kernel, _, why in array_shape_problems(kernels)}
    assert set(found) == {"by_block", "by_size", "sum_in_shape"}, found
    assert "computed when the kernel runs" in found["by_block"] and "`cuda.blockDim.x`" in found["by_block"]
    assert found["by_size"] == "`n` is set inside the kernel, when it runs"
    assert "`bm + pad`" in found["sum_in_shape"]
