"""The digits demo: data, model, training and the `jaxrobust demo` report."""
