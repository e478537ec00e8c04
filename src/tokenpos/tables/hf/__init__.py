"""Reading Hugging Face configs (a ``PretrainedConfig`` or its ``config.json`` dict) into tokenpos arguments.

``rope`` reads the RoPE settings every rotary model shares (and holds the layers' ``from_hf_config``
mixin); ``models`` reads the model-specific ones (Llama 4's NoPE layers and temperature, Qwen-VL's
M-RoPE sections, Pixtral's 2-D RoPE). A config key that changes the result is honoured or refused,
never ignored. Modules here may import ``tables.formulas`` and ``tables.checks``; neither imports
them back. Nothing here imports ``transformers`` or a backend.
"""
