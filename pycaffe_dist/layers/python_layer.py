"""The Python layer: a user's class named by python_param, as in pycaffe."""
