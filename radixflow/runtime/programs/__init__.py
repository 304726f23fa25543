"""Request-graph execution: the wire format of programs and the executor that runs them inside the scheduler."""
