"""The one topological sort that every engine of the course walks its graph with.

micrograd's Value, the Tensor, minitf's nodes and the drawings of course.viz each keep their
inputs under another name (`_prev`, `inputs`, ...), so the sort takes a function that lists a
node's inputs. It is a depth-first search with an explicit stack instead of recursion, so a
graph 100,000 nodes deep does not reach Python's recursion limit. (Lesson 1.2 writes the same
walk itself; this is the one the package uses.)
"""


def topological_order(roots, children_of, stop=()):
    """Every node reachable from `roots`, each once, after all the nodes it reads.

    roots:       the nodes to start from (a list; the first one is walked first).
    children_of: `children_of(node)` lists the inputs of `node` in operand order (None entries,
                 absent optional inputs, are skipped).
    stop:        nodes that are included but whose inputs are not followed (a fed placeholder).

    Each stack entry says whether the node's inputs have been pushed already: a node is emitted
    the second time it comes off the stack, after them. Nodes are told apart by identity (id),
    so unhashable nodes work too. Inputs are visited in operand order, so the order is the same
    on every run.
    """
    order, entered = [], set()
    stop = {id(n) for n in stop}
    stack = [(node, False) for node in reversed(list(roots))]
    while stack:
        node, inputs_done = stack.pop()
        if inputs_done:
            order.append(node)
            continue
        if id(node) in entered:
            continue
        entered.add(id(node))
        stack.append((node, True))
        if id(node) not in stop:
            # In a DAG an input that was entered already has been emitted already.
            stack.extend((child, False) for child in reversed(tuple(children_of(node)))
                         if child is not None and id(child) not in entered)
    return order
