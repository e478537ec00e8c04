"""Every formula of tokenpos: pure functions of their arguments and frozen values, in float64 NumPy.

One module per scheme or concept (sinusoidal tables, RoPE frequencies, scalings, variant state and
rotations, M-RoPE, 2-D RoPE, xPos, ALiBi, T5 buckets, KERPLE, FIRE, Llama 4's layer pattern and
temperature, attention offsets and the causal mask, init schemes, counter-based dropout, default
positions, vocab sharding). A formula checks its arguments with ``tables.checks`` (the ``check_*``
functions and ``*_message`` builders live there) and reads no Hugging Face config (``tables.hf``
does). Imports here go to ``tables.checks``, ``tables.errors`` and other formulas only; nothing
imports a backend.
"""
