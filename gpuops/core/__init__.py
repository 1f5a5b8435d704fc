"""Pure model of GPU nodes: dataclasses and functions, no I/O, valid Python 3.8."""
