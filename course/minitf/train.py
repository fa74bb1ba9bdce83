"""Training (lesson 3.2): an optimizer adds the update nodes to the graph.

`GradientDescentOptimizer(lr).minimize(loss)` builds, once, the gradient of the loss for every
variable and the nodes `w <- w - lr * dloss/dw`; running the returned node takes one step.
"""

from .autodiff import gradients
from .graph import topological_order
from .ops import assign_sub, group


def trainable_variables(loss):
    """The Variables that `loss` depends on, in the order they were created."""
    found = [n for n in topological_order([loss]) if n.op == "variable"]
    index = {n: i for i, n in enumerate(loss.graph.nodes)}
    return sorted(found, key=index.__getitem__)


class GradientDescentOptimizer:
    """Plain gradient descent: w <- w - learning_rate * dloss/dw."""

    def __init__(self, learning_rate):
        self.learning_rate = float(learning_rate)

    def compute_gradients(self, loss, var_list=None):
        """Pairs (gradient node, variable) for the variables of `loss`."""
        var_list = trainable_variables(loss) if var_list is None else list(var_list)
        return list(zip(gradients(loss, var_list), var_list))

    def apply_gradients(self, grads_and_vars, name="GradientDescent"):
        graph = grads_and_vars[0][1].graph
        updates = []
        with graph.as_default(), graph.name_scope(name):
            for g, var in grads_and_vars:
                if g is None:
                    continue  # the loss does not depend on this variable
                updates.append(assign_sub(var, g * self.learning_rate, name=f"update_{var.name}"))
        return group(updates, name=name)

    def minimize(self, loss, var_list=None):
        """A node whose run does one gradient-descent step on every variable the loss depends on."""
        return self.apply_gradients(self.compute_gradients(loss, var_list))
