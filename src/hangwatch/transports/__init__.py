"""One boundary module per way of reaching a node (ssh today; ray, slurm and kubectl next). Each runs the
collector once per node and returns a ``NodeResult`` per node: a node that fails is evidence, never an
exception that stops the others."""
