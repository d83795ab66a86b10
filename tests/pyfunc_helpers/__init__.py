"""Python functions that pyfunc op specs of the tests name (``pyfunc_helpers.np_ops:<function>``)."""
