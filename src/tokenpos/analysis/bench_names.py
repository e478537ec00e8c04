"""The benchmark's case names, in the order ``run_bench`` runs them.

Import-light (no NumPy, no kernels): ``tokenpos bench --cases`` checks its argument against these while parsing,
and a bad argument must not import numba or torch (tests/cli/test_lazy_imports.py).
"""

CASES = ("forward", "dropout", "bf16", "rope", "block", "compiled", "train_lazy", "train_exact", "ngram", "jit",
         "calls")
