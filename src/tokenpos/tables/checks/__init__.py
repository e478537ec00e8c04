"""The input checks of tokenpos and their error messages, written once for both backends.

``validation`` holds the generic checks (integers, floats, ids, positions, dtypes, state_dicts) and
their messages; the other modules hold the checks of one concept each: attention inputs, the bias
schemes' settings, ``TransformerEmbedding``'s arguments, the q/k checks every rotary layer shares,
the xPos / 2-D RoPE / M-RoPE layers' own checks, and the values of a RoPE scaling dict. Every
``check_*`` function and ``*_message`` builder belongs here (a formula may still raise for a relation
among its own arguments; the registry words the shortcut errors it raises itself). A check computes no
table: modules here import ``tables.errors``, ``tables.registry`` and each other, never
``tables.formulas`` or ``tables.hf`` (the formulas call the checks, not the other way round).
"""
